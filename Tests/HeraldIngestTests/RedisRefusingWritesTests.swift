import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

/// A Redis at `maxmemory` (with `noeviction`) still answers PING and reads but refuses every write with `OOM`, as a
/// demoted master does with `READONLY`: that is Redis unable to serve now, a 503 to retry, not the 500 of a bug.
@Suite(.serialized) struct RedisRefusingWritesTests {
    @Test func aRedisRefusingWritesAnswers503AndServesAgainOnceItTakesWrites() async throws {
        let apps = try TestApps(count: 1)
        defer { apps.remove() }
        let directory = try scratchDirectory("herald-redis-oom-")
        let port = try freePort()
        let redis = try ChildProcess("redis-server", executable: "/usr/bin/redis-server", arguments: [
            "--bind", "127.0.0.1", "--port", "\(port)", "--save", "", "--appendonly", "no", "--dir", directory,
            "--maxmemory-policy", "noeviction",
        ], environment: [:], logPath: directory + "/redis.log")
        @Sendable func cli(_ arguments: String...) throws -> String { try runTool("redis-cli", ["-p", "\(port)"] + arguments) }
        try await eventually("the test's redis-server answers", timeout: .seconds(10)) {
            (try? cli("PING"))?.contains("PONG") == true
        }
        let ingest = try await IngestProcess(apps: apps, environment: ["HERALD_REDIS_URL": "redis://127.0.0.1:\(port)/0"])
        let app = apps.apps[0]
        func subscribe() async throws -> RawHTTPClient.Response {
            let body = #"{"channel":"order:1:status","deviceToken":"\#(SecureRandom.hex(32))","tokenType":"alert"}"#
            let port = ingest.port
            return try await onThread {
                try RawHTTPClient(port: port).request("POST", "/v1/apps/\(app.id)/subscriptions",
                                                      headers: ["Content-Type": "application/json", "X-API-Key": app.userKey],
                                                      body: body)
            }
        }
        #expect(try await subscribe().status == 201)
        #expect(try cli("CONFIG", "SET", "maxmemory", "1").contains("OK"))
        let refused = try await subscribe()
        #expect(refused.status == 503, "\(refused.text)")
        #expect(refused.text.contains("refusing writes"), "\(refused.text)")
        _ = try cli("CONFIG", "SET", "maxmemory", "0")
        #expect(try await subscribe().status == 201)
        let log = try await ingest.stop()
        #expect(log.contains("redis refused a write"), "\(log)")
        await redis.crash()
    }
}
