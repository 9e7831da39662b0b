import Foundation
import HeraldAPNsSimulator
import HeraldRuntime
import Testing

/// The simulator's iOS 18 broadcast side, driven with curl: channel management on its own listener, and
/// broadcasts on the push listener, each checked the way Apple's documentation says.
@Suite struct BroadcastSimulatorTests {
    private func manage(_ harness: Harness, _ method: String, _ suffix: String, channel: String? = nil,
                        body: String? = nil, jwt: String? = nil) throws -> HTTPRequest {
        var headers = [("authorization", "bearer " + (jwt ?? harness.providerToken))]
        if let channel { headers.append(("apns-channel-id", channel)) }
        return HTTPRequest(method: method, path: harness.manageBase + "/1/apps/\(bundleID)/" + suffix, headers: headers,
                           body: body)
    }

    private func create(_ harness: Harness, policy: Int) throws -> HTTPRequest {
        try manage(harness, "POST", "channels", body: #"{"message-storage-policy":\#(policy),"push-type":"LiveActivity"}"#)
    }

    private func broadcast(_ harness: Harness, channel: String?, expiration: String? = "0",
                           body: String = #"{"aps":{"timestamp":1700000000,"event":"update","content-state":{"step":2}}}"#)
        throws -> HTTPRequest {
        var headers = [("authorization", "bearer " + harness.providerToken), ("apns-push-type", "liveactivity"),
                       ("apns-priority", "10")]
        if let channel { headers.append(("apns-channel-id", channel)) }
        if let expiration { headers.append(("apns-expiration", expiration)) }
        return HTTPRequest(path: "/4/broadcasts/apps/\(bundleID)", headers: headers, body: body)
    }

    @Test("channels are created, read, listed and deleted on the management listener only")
    func channelLifecycle() async throws {
        let harness = try Harness()
        let created = try await curl(harness, [try create(harness, policy: 0), try create(harness, policy: 1)])
        try #require(created.map(\.status) == [201, 201])
        let ids = created.compactMap { $0.headers["apns-channel-id"] }
        try #require(ids.count == 2 && ids[0] != ids[1])
        #expect(ids.allSatisfy { Data(base64Encoded: $0) != nil })
        #expect(created.allSatisfy { isLowercaseUUID($0.headers["apns-request-id"]) && $0.body.isEmpty })

        let answers = try await curl(harness, [
            try manage(harness, "GET", "channels", channel: ids[0]),
            try manage(harness, "GET", "channels", channel: ids[1]),
            try manage(harness, "GET", "all-channels"),
            try manage(harness, "DELETE", "channels", channel: ids[0]),
            try manage(harness, "GET", "channels", channel: ids[0]),
            try manage(harness, "DELETE", "channels", channel: ids[0]),
            try manage(harness, "GET", "all-channels"),
            // The push listener does not serve the management API.
            HTTPRequest(method: "GET", path: "/1/apps/\(bundleID)/all-channels",
                        headers: [("authorization", "bearer " + harness.providerToken)]),
        ])
        await harness.stop()
        try #require(answers.count == 8)
        #expect(answers[0].status == 200 && answers[0].json?["message-storage-policy"]?.numberValue == 0)
        #expect(answers[0].json?["push-type"]?.stringValue == "LiveActivity")
        #expect(answers[1].json?["message-storage-policy"]?.numberValue == 1)
        #expect(Set(answers[2].json?["channels"]?.arrayValue?.compactMap(\.stringValue) ?? []) == Set(ids))
        #expect(answers[3].status == 204)
        #expect(answers[4].status == 400 && answers[4].reason == "ChannelNotRegistered")
        #expect(answers[5].status == 400 && answers[5].reason == "ChannelNotRegistered")
        #expect(answers[6].json?["channels"]?.arrayValue?.compactMap(\.stringValue) == [ids[1]])
        #expect(answers[7].status == 405, "\(answers[7].body)")
        #expect(harness.simulator.channels.ids(bundle: bundleID) == [ids[1]])
    }

    @Test("each channel management mistake gets Apple's status and reason")
    func managementRules() async throws {
        let harness = try Harness(topics: [bundleID, "com.example.nobroadcast"]) { configuration in
            configuration.maxChannelsPerBundle = 1
            configuration.broadcastDisabledBundles = ["com.example.nobroadcast"]
        }
        let first = try await curl(harness, [try create(harness, policy: 1)])
        try #require(first.first?.status == 201)
        var disabled = try create(harness, policy: 0)
        disabled.path = harness.manageBase + "/1/apps/com.example.nobroadcast/channels"
        let cases: [(String, HTTPRequest, Int, String?)] = [
            ("past the cap", try create(harness, policy: 0), 400, "CannotCreateChannelConfig"),
            ("no push type", try manage(harness, "POST", "channels", body: #"{"message-storage-policy":0}"#), 400,
             "MissingPushType"),
            ("other push type", try manage(harness, "POST", "channels",
                                           body: #"{"message-storage-policy":0,"push-type":"Alert"}"#), 400, "InvalidPushType"),
            ("policy 2", try manage(harness, "POST", "channels",
                                    body: #"{"message-storage-policy":2,"push-type":"LiveActivity"}"#), 400, "BadRequestParams"),
            ("body not JSON", try manage(harness, "POST", "channels", body: "policy=0"), 400, "BadRequestPayload"),
            ("read without an id", try manage(harness, "GET", "channels"), 400, "MissingChannelId"),
            ("id not base64", try manage(harness, "GET", "channels", channel: "not base64!"), 400, "BadChannelId"),
            ("unknown id", try manage(harness, "DELETE", "channels", channel: "AAAAAAAAAAAAAAAAAAAAAA=="), 400,
             "ChannelNotRegistered"),
            ("PUT", try manage(harness, "PUT", "channels", body: "{}"), 405, "MethodNotAllowed"),
            ("other path", try manage(harness, "GET", "channel"), 404, "BadPath"),
            ("no capability", disabled, 400, "FeatureNotEnabled"),
            ("apns-request-id not a UUID", try manage(harness, "GET", "all-channels").with("apns-request-id", "12345"), 400,
             "BadMessageId"),
            ("expired provider token", try manage(harness, "GET", "all-channels", jwt: try harness.jwt(age: 7200)), 403,
             "ExpiredProviderToken"),
        ]
        try await expectAnswers(harness, cases, idHeader: "apns-request-id")
    }

    @Test("a broadcast reaches the channel's devices once, and each mistake gets Apple's answer in Apple's order")
    func broadcastRules() async throws {
        let harness = try Harness()
        let created = try await curl(harness, [try create(harness, policy: 0), try create(harness, policy: 1)])
        let ids = created.compactMap { $0.headers["apns-channel-id"] }
        try #require(ids.count == 2)
        let (quiet, stored) = (ids[0], ids[1])
        #expect(harness.simulator.channels.setSubscribers(100_000, channelID: quiet))
        let large = #"{"aps":{"timestamp":1,"event":"update","content-state":{"x":""#
            + String(repeating: "x", count: 4_900) + #""}}}"#
        let tooLarge = #"{"aps":{"timestamp":1,"event":"update","content-state":{"x":""#
            + String(repeating: "x", count: 5_100) + #""}}}"#
        let start = #"{"aps":{"timestamp":1,"event":"start","content-state":{},"attributes-type":"A","attributes":{}}}"#
        var empty = try broadcast(harness, channel: quiet)
        empty.body = nil
        var get = empty
        get.method = "GET"
        let cases: [(String, HTTPRequest, Int, String?)] = [
            ("update on a no-storage channel", try broadcast(harness, channel: quiet), 200, nil),
            ("end with a far expiration on a storing channel",
             try broadcast(harness, channel: stored, expiration: "1900000000",
                           body: #"{"aps":{"timestamp":2,"event":"end","content-state":{},"dismissal-date":3}}"#), 200, nil),
            ("payload of 4,950 bytes", try broadcast(harness, channel: stored, expiration: nil, body: large), 200, nil),
            ("a topic", try broadcast(harness, channel: quiet).with("apns-topic", bundleID), 400, "TopicDisallowed"),
            ("no channel", try broadcast(harness, channel: nil), 400, "MissingChannelId"),
            ("channel not base64", try broadcast(harness, channel: "!!"), 400, "BadChannelId"),
            ("no push type", try broadcast(harness, channel: quiet).with("apns-push-type", nil), 400, "MissingPushType"),
            ("alert push type", try broadcast(harness, channel: quiet).with("apns-push-type", "alert"), 400,
             "InvalidPushType"),
            ("expiration not a number", try broadcast(harness, channel: quiet, expiration: "soon"), 400, "BadExpirationDate"),
            ("priority 7", try broadcast(harness, channel: quiet).with("apns-priority", "7"), 400, "BadPriority"),
            ("unknown channel", try broadcast(harness, channel: "AAAAAAAAAAAAAAAAAAAAAA=="), 400, "ChannelNotRegistered"),
            ("expiration on a no-storage channel", try broadcast(harness, channel: quiet, expiration: "1900000000"), 400,
             "BadExpirationDate"),
            ("empty payload", empty, 400, "PayloadEmpty"),
            ("payload over 5,120 bytes", try broadcast(harness, channel: stored, expiration: nil, body: tooLarge), 413,
             "PayloadTooLarge"),
            ("a start event", try broadcast(harness, channel: quiet, body: start), 400, "BadRequestPayload"),
            ("GET", get, 405, "MethodNotAllowed"),
        ]
        try await expectAnswers(harness, cases, idHeader: "apns-request-id")
        #expect(large.utf8.count > 4096 && large.utf8.count <= 5120 && tooLarge.utf8.count > 5120)
        let records = try harness.broadcasts()
        try #require(records.count == 3)
        #expect(records[0]["channelId"]?.stringValue == quiet && records[0]["expiration"]?.numberValue == 0)
        #expect(records[0]["subscribers"]?.numberValue == 100_000 && records[0]["priority"]?.numberValue == 10)
        #expect(records[0]["payload"]?["aps"]?["content-state"]?["step"]?.numberValue == 2)
        #expect(records[1]["channelId"]?.stringValue == stored && records[1]["expiration"]?.numberValue == 1_900_000_000)
        #expect(harness.simulator.channels.broadcastCounts == (3, 100_000))
        #expect(try harness.accepted().isEmpty, "broadcasts are not device pushes")
    }

    @Test("a channelId rule answers that channel's broadcasts, the first N times")
    func channelRule() async throws {
        let harness = try Harness()
        let created = try await curl(harness, [try create(harness, policy: 0)])
        let id = try #require(created.first?.headers["apns-channel-id"])
        try harness.simulator.setRules([SimulatorRule(channelID: id, times: 2, status: 503, reason: "ServiceUnavailable")])
        let answers = try await curl(harness, (0..<3).map { _ in try broadcast(harness, channel: id) })
        await harness.stop()
        #expect(answers.map(\.status) == [503, 503, 200])
        #expect(answers.first?.reason == "ServiceUnavailable")
        #expect(throws: ConfigurationError.self) {
            try SimulatorRule.parse(Data(#"{"rules":[{"channelId":"AAAA","delayMs":5,"status":503,"reason":"X"}]}"#.utf8))
        }
    }
}
