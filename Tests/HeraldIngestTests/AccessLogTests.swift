import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

/// The log a user gets from the real executable: at the defaults one access line per request and no per-event
/// line; with `HERALD_ACCESS_LOG=off` neither. Every run's last line ("stopped")
/// proves the buffered writer flushes on exit.
@Suite(.serialized) struct AccessLogTests {
    @Test func theDefaultsWriteOneAccessLinePerRequestAndOffWritesNone() async throws {
        let apps = try TestApps(count: 1)
        defer { apps.remove() }
        for accessLog in [nil, "off"] {
            let ingest = try await IngestProcess(apps: apps, environment: accessLog.map { ["HERALD_ACCESS_LOG": $0] } ?? [:])
            let app = apps.apps[0]
            let port = ingest.port
            for _ in 0..<3 {
                let body = #"{"channel":"order:1:status","deviceToken":"\#(SecureRandom.hex(32))","tokenType":"alert"}"#
                let response = try await onThread {
                    try RawHTTPClient(port: port).request("POST", "/v1/apps/\(app.id)/subscriptions",
                                                          headers: ["Content-Type": "application/json", "X-API-Key": app.userKey],
                                                          body: body)
                }
                #expect(response.status == 201, "\(response.text)")
            }
            let written = try await ingest.stop()
            let lines = written.split(separator: "\n")
            let requests = lines.filter { $0.contains(#""msg":"request""#) && $0.contains("/subscriptions") }
            #expect(requests.count == (accessLog == nil ? 3 : 0), "\(written)")
            for line in requests {
                #expect(line.contains(#""http.status":"201""#) && line.contains(#""http.route":"/v1/apps/{appID}/subscriptions""#))
            }
            #expect(!written.contains("subscription created"), "a per-event line at the default level")
            #expect(lines.last?.contains(#""msg":"stopped""#) == true, "the last lines were not flushed at exit: \(written)")
        }
    }
}
