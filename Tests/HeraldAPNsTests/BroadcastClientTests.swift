import Foundation
import HeraldAPNs
import HeraldAPNsSimulator
import HeraldRuntime
import Testing

/// The APNs client's iOS 18 broadcast side against the in-process simulator: channel management on the
/// management host, broadcasts on the push host. Ports 20521–20522.
@Suite struct BroadcastClientTests {
    static let update = Array(#"{"aps":{"timestamp":1700000000,"event":"update","content-state":{"score":"2-1"}}}"#.utf8)

    @Test func createsReadsListsAndDeletesChannels() async throws {
        let fixture = try SimulatorFixture(port: 20521)
        let client = try fixture.client()
        let bundle = SimulatorFixture.topic
        let quiet = try await client.manage(.create(bundleID: bundle, storagePolicy: .noStorage),
                                            credentials: fixture.credentials, environment: .production)
        let stored = try await client.manage(.create(bundleID: bundle, storagePolicy: .mostRecentMessage),
                                             credentials: fixture.credentials, environment: .sandbox)
        #expect(quiet.status == 201 && stored.status == 201 && quiet.isSuccess)
        let quietID = try #require(quiet.channelID), storedID = try #require(stored.channelID)
        #expect(quiet.requestID?.count == 36)

        let read = try await client.manage(.read(bundleID: bundle, channelID: storedID), credentials: fixture.credentials,
                                           environment: .production)
        #expect(read.status == 200 && read.storagePolicy == .mostRecentMessage)
        let list = try await client.manage(.list(bundleID: bundle), credentials: fixture.credentials,
                                           environment: .production)
        #expect(Set(list.channels ?? []) == [quietID, storedID])
        let deleted = try await client.manage(.delete(bundleID: bundle, channelID: quietID),
                                              credentials: fixture.credentials, environment: .production)
        #expect(deleted.status == 204)
        let gone = try await client.manage(.read(bundleID: bundle, channelID: quietID), credentials: fixture.credentials,
                                           environment: .production)
        #expect(gone.status == 400 && gone.reason == .channelNotRegistered && gone.disposition == .permanent)
        #expect(fixture.simulator.channels.ids(bundle: bundle) == [storedID])
        // Locally refused: an id that is not base64 never reaches APNs.
        await #expect(throws: APNsError.self) {
            _ = try await client.manage(.delete(bundleID: bundle, channelID: "a b"), credentials: fixture.credentials,
                                        environment: .production)
        }
        await client.shutdown()
        await fixture.stop()
    }

    @Test func publishesOneBroadcastWithApplesHeaders() async throws {
        let fixture = try SimulatorFixture(port: 20522)
        let client = try fixture.client()
        let bundle = SimulatorFixture.topic
        let quietID = try #require(try await client.manage(.create(bundleID: bundle, storagePolicy: .noStorage),
                                                           credentials: fixture.credentials,
                                                           environment: .production).channelID)
        let storedID = try #require(try await client.manage(.create(bundleID: bundle, storagePolicy: .mostRecentMessage),
                                                            credentials: fixture.credentials,
                                                            environment: .production).channelID)
        fixture.simulator.channels.setSubscribers(100_000, channelID: quietID)

        // A no-storage channel gets apns-expiration 0 whatever the request asked for.
        let first = try await client.publish(
            APNsBroadcastRequest(bundleID: bundle, channelID: quietID, payload: Self.update, priority: .powerConsiderate,
                                 expiration: Date(timeIntervalSince1970: 1_900_000_000), storagePolicy: .noStorage),
            credentials: fixture.credentials, environment: .production)
        #expect(first.status == 200 && first.uniqueID != nil)
        let second = try await client.publish(
            APNsBroadcastRequest(bundleID: bundle, channelID: storedID, payload: Self.update,
                                 expiration: Date(timeIntervalSince1970: 1_900_000_000), storagePolicy: .mostRecentMessage),
            credentials: fixture.credentials, environment: .production)
        #expect(second.status == 200)
        let unknown = try await client.publish(
            APNsBroadcastRequest(bundleID: bundle, channelID: "AAAAAAAAAAAAAAAAAAAAAA==", payload: Self.update,
                                 storagePolicy: .noStorage),
            credentials: fixture.credentials, environment: .production)
        #expect(unknown.status == 400 && unknown.reason == .channelNotRegistered)

        try fixture.simulator.setRules([SimulatorRule(channelID: storedID, times: 1, status: 429, reason: "TooManyRequests")])
        let throttled = try await client.publish(
            APNsBroadcastRequest(bundleID: bundle, channelID: storedID, payload: Self.update, storagePolicy: .mostRecentMessage),
            credentials: fixture.credentials, environment: .production)
        #expect(throttled.status == 429 && throttled.disposition == .retry)

        let big = APNsBroadcastRequest(bundleID: bundle, channelID: quietID, payload: Array(repeating: 0x20, count: 5121),
                                       storagePolicy: .noStorage)
        #expect(throws: APNsError.self) { try big.validate() }

        let preview = try client.preview(
            APNsBroadcastRequest(bundleID: bundle, channelID: quietID, payload: Self.update, storagePolicy: .noStorage),
            credentials: fixture.credentials, environment: .production)
        let headers = Dictionary(preview.headers, uniquingKeysWith: { first, _ in first })
        #expect(headers[":path"] == "/4/broadcasts/apps/\(bundle)" && headers["apns-topic"] == nil)
        #expect(headers["apns-push-type"] == "liveactivity" && headers["apns-expiration"] == "0")
        #expect(headers["apns-channel-id"] == quietID)

        let records = try fixture.broadcasts()
        try #require(records.count == 2)
        #expect(records[0]["channelId"]?.stringValue == quietID && records[0]["expiration"]?.numberValue == 0)
        #expect(records[0]["priority"]?.numberValue == 5 && records[0]["subscribers"]?.numberValue == 100_000)
        #expect(records[1]["expiration"]?.numberValue == 1_900_000_000)
        #expect(records[1]["payload"]?["aps"]?["content-state"]?["score"]?.stringValue == "2-1")
        #expect(try fixture.accepted().isEmpty)
        await client.shutdown()
        await fixture.stop()
    }
}
