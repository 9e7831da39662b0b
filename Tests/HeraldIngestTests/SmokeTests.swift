import Foundation
import HeraldTestSupport
import Testing

@Suite struct IngestSmokeTests {
    @Test func subscribeThenPublishAnEvent() async throws {
        let ingest = try await IngestHarness.start()
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let token = deviceToken()
        let created = try await ingest.request("POST", "/v1/apps/\(app.id)/subscriptions", key: app.publicKey,
                                               json: #"{"channel": "order:42:status", "deviceToken": "\#(token)", "tokenType": "alert"}"#)
        #expect(created.status == 201, "\(created.text)")
        #expect(created.headers["ratelimit-limit"] == "240")
        let event = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey,
                                             json: #"{"channel": "order:42:status", "alert": {"aps": {"alert": "hi"}}}"#)
        #expect(event.status == 202, "\(event.text)")
        let ready = try await ingest.request("GET", "/readyz")
        #expect(ready.status == 200, "\(ready.text)")
    }

    /// With `HERALD_INGEST_ADMIN_ADDR` the metrics leave the API's (public) port: 404 there, served on the admin
    /// address; both answer the probes.
    @Test func metricsCanHaveAnAddressOfTheirOwn() async throws {
        let ingest = try await IngestHarness.start(adminPort: true)
        defer { Task { await ingest.stop() } }
        let adminPort = try #require(ingest.adminPort)
        #expect(try await ingest.request("GET", "/metrics").status == 404)
        let metrics = try await onThread { try RawHTTPClient(port: adminPort).request("GET", "/metrics") }
        #expect(metrics.status == 200 && metrics.text.contains("herald_http_requests_total"))
        for port in [ingest.port, adminPort] {
            let health = try await onThread { try RawHTTPClient(port: port).request("GET", "/healthz") }
            #expect(health.status == 200)
        }
        let api = try await onThread { try RawHTTPClient(port: adminPort).request("GET", "/v1/apps/x/subscriptions?deviceToken=00") }
        #expect(api.status == 404, "the admin address serves no API")
    }
}
