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
}
