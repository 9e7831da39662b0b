import Foundation
@testable import HeraldAPNsSimulator
import HeraldCrypto
import HeraldRuntime
import Testing

@Suite("APNs simulator programmable failures")
struct RuleTests {
    @Test("rules file: 410 with timestamp for a prefix, 503 for the first two attempts, a delay; reloaded on change")
    func rulesFile() async throws {
        let harness = try Harness(rulesJSON: """
            {"rules": [
              {"tokenPrefix": "dead", "status": 410, "reason": "Unregistered", "timestamp": 1700000000000},
              {"tokenPrefix": "ab", "status": 410, "reason": "ExpiredToken"},
              {"tokenPrefix": "5030", "status": 503, "reason": "ServiceUnavailable", "times": 2},
              {"tokenPrefix": "de1a", "delayMs": 1200}
            ]}
            """)
        let dead = deviceToken("dead"), expired = deviceToken("ab"), flaky = deviceToken("5030")
        let slow = deviceToken("de1a"), healthy = deviceToken("0000")
        let jwt = harness.providerToken
        let before = Date().timeIntervalSince1970 * 1000
        let responses = try await curl(harness, try [dead, expired, flaky, flaky, flaky, slow, healthy].map {
            try harness.alert($0, jwt: jwt)
        })
        try #require(responses.count == 7)
        #expect(responses[0].status == 410)
        #expect(responses[0].json == .object(["reason": .string("Unregistered"), "timestamp": .number(1_700_000_000_000)]))
        #expect(responses[1].status == 410)
        #expect(responses[1].reason == "ExpiredToken")
        let stamp = try #require(responses[1].json?["timestamp"]?.numberValue)
        #expect(stamp >= before.rounded(.down) && stamp <= Date().timeIntervalSince1970 * 1000)
        #expect(responses[2].status == 503)
        #expect(responses[2].reason == "ServiceUnavailable")
        #expect(responses[3].status == 503)
        #expect(responses[4].status == 200)
        #expect(responses[5].status == 200)
        #expect(responses[5].seconds >= 1.1)
        #expect(responses[6].status == 200)
        #expect(responses[6].seconds < 1)
        #expect(responses.dropFirst().allSatisfy { !$0.newConnection })

        // "Fail now, succeed later": the file changes, the next request sees it.
        try harness.writeRules(#"{"rules": [{"tokenPrefix": "0000", "status": 500, "reason": "InternalServerError"}]}"#)
        try await Task.sleep(for: .milliseconds(250))
        let later = try await curl(harness, [try harness.alert(dead, jwt: jwt), try harness.alert(healthy, jwt: jwt)])
        // A broken file is refused and the previous rules stay in force.
        try harness.writeRules(#"{"rules": [{"tokenPrefix": "0000", "status": 200}]}"#)
        try await Task.sleep(for: .milliseconds(250))
        let afterBrokenFile = try await curl(harness, [try harness.alert(healthy, jwt: jwt)])
        await harness.stop()
        #expect(later.map(\.status) == [200, 500])
        #expect(later[1].reason == "InternalServerError")
        #expect(afterBrokenFile.first?.status == 500)

        let accepted = try harness.accepted().compactMap { $0["token"]?.stringValue }
        #expect(accepted == [flaky, slow, healthy, dead])
        let rejected = try harness.rejected()
        #expect(rejected.first?["reason"]?.stringValue == "Unregistered")
        #expect(rejected.first?["timestamp"] == .number(1_700_000_000_000))
        #expect(rejected.first?["token"]?.stringValue == dead)
    }

    @Test("GOAWAY after N streams: later streams are not processed and the client moves to a new connection")
    func goawayAfterStreams() async throws {
        let harness = try Harness()
        // One stream first: deterministic whether or not nghttp opened its streams before it saw the server's
        // initial limit of one stream (streams past that limit are refused).
        try harness.simulator.setRules([.goaway(afterStreams: 1, reason: "Shutdown")])
        let push = try harness.alert(deviceToken())
        // nghttp sends a URI once: three tokens make three streams.
        let log = try await nghttp(harness, paths: (0..<3).map { _ in "/3/device/" + deviceToken() },
                                   headers: push.headers, body: push.body)
        let acceptedByNghttp = try harness.accepted().count
        try harness.simulator.setRules([.goaway(afterStreams: 2)])
        let sequential = try await curl(harness, [push, push, push])
        await harness.stop()

        let lines = log.split(separator: "\n")
        let frame = try #require(lines.firstIndex { $0.contains("recv GOAWAY frame") }, "\(log)")
        let goaway = lines[frame + 1]
        let answered = lines.filter { $0.contains(":status: 200") }
        try #require(answered.count == 1, "\(log)")
        let streamID = try #require(answered[0].split(separator: "=").last?.split(separator: ")").first)
        #expect(goaway.contains("last_stream_id=\(streamID),"), "\(goaway)")
        #expect(goaway.contains("error_code=NO_ERROR"))
        #expect(goaway.contains(#"{"reason":"Shutdown"}"#))
        #expect(acceptedByNghttp == 1)

        #expect(sequential.map(\.status) == [200, 200, 200])
        #expect(sequential.map(\.newConnection) == [true, false, true])
        #expect(try harness.accepted().count == 4)
    }

    @Test("a reset rule drops the connection for the first attempt; the retry succeeds")
    func resetConnection() async throws {
        let harness = try Harness()
        try harness.simulator.setRules([.resetConnection(tokenPrefix: "dd", times: 1)])
        let token = deviceToken("dd")
        let push = try harness.alert(token)
        let first = try await curlResult(harness, [push])
        let second = try await curl(harness, [push])
        await harness.stop()
        #expect(first.result.status != 0)
        #expect(first.responses.isEmpty)
        #expect(second.first?.status == 200)
        #expect(try harness.accepted().count == 1)
    }

    @Test("a configured response delay holds every answer, accepted or rejected, without serialising them")
    func configuredResponseDelay() async throws {
        let harness = try Harness(responseDelay: .milliseconds(400) ... .milliseconds(400))
        let jwt = harness.providerToken
        let requests = try (0..<20).map { _ in try harness.alert(deviceToken(), jwt: jwt) }
            + [try harness.alert(deviceToken(), jwt: jwt).with("apns-topic", "com.example.other")]
        let started = ContinuousClock.now
        let responses = try await curl(harness, requests, extra: ["--parallel", "--parallel-immediate"])
        let elapsed = ContinuousClock.now - started
        await harness.stop()
        try #require(responses.count == 21)
        // In parallel, curl reports in the order answers came: count them rather than match them up.
        #expect(responses.map(\.status).sorted() == Array(repeating: 200, count: 20) + [400])
        #expect(responses.allSatisfy { $0.seconds >= 0.39 }, "\(responses.map(\.seconds))")
        // One after another they would take 21 × 0.4 s.
        #expect(elapsed < .seconds(6))
        #expect(try harness.accepted().count == 20)
    }

    @Test("topics are two or more non-empty labels of letters, digits, - and _; a repeated header is refused")
    func topicsAndDuplicateHeaders() {
        for good in ["com.example.app", "a.b", "com.example-app_2.voip", String(repeating: "a.", count: 127) + "a"] {
            #expect(RequestValidator.isWellFormedTopic(good), "\(good)")
        }
        for bad in ["", "com", ".com.example", "com.example.", "com..example", "com.exa mple", "com.ex/ample",
                    "com.exämple", String(repeating: "a.", count: 128)] {
            #expect(!RequestValidator.isWellFormedTopic(bad), "\(bad)")
        }
        var request = IncomingRequest()
        request.headers = [("apns-topic", "a.b"), ("apns-push-type", "alert"), ("apns-priority", "10")]
        #expect(RequestValidator.duplicates(request) == nil)
        request.headers.append(("apns-push-type", "alert"))
        #expect(RequestValidator.duplicates(request)?.reason == "DuplicateHeaders")
    }

    @Test("a topic is BUNDLE_ID (any team) or TEAMID:BUNDLE_ID (that team only)")
    func topicOwnership() throws {
        var configuration = APNsSimulatorConfiguration(listen: HostPort(host: "127.0.0.1", port: 0),
                                                       certificateChainPath: "", privateKeyPath: "", providerKeys: [])
        try configuration.allowTopics(["com.example.any", "TEAM123456:com.example.shop", "OTHERTEAM1:com.example.shop"])
        #expect(configuration.allowedTopics == ["com.example.any", "com.example.shop"])
        #expect(configuration.topicOwners == ["com.example.shop": ["TEAM123456", "OTHERTEAM1"]])
        #expect(configuration.team("TEAM123456", mayUse: "com.example.shop"))
        #expect(configuration.team("RIVALTEAM1", mayUse: "com.example.any"))
        #expect(!configuration.team("RIVALTEAM1", mayUse: "com.example.shop"))
        #expect(!configuration.team("TEAM123456", mayUse: "com.example.unlisted"))
        // An extension's bundle id is its app's team's.
        #expect(configuration.team("TEAM123456", mayUse: "com.example.shop.widget"))
        #expect(!configuration.team("RIVALTEAM1", mayUse: "com.example.shop.widget"))
        #expect(!configuration.team("TEAM123456", mayUse: "com.example.shopping"))
        for bad in ["", "TEAM123456:", ":com.example.shop", "TEAM123456:com.example.shop:extra"] {
            #expect(throws: ConfigurationError.self, "\(bad)") { try configuration.allowTopics([bad]) }
        }
    }

    @Test("delayed answers leave in due order, each once, across the queue's compactions")
    func dueQueueOrder() {
        var queue = DueQueue<Int>()
        let start = ContinuousClock.now
        // Due times out of order (a range of delays), more than the queue compacts at.
        let dues = (0..<5_000).map { ($0 * 7_919) % 5_000 }
        for (element, due) in dues.enumerated() { queue.insert(element, due: start + .milliseconds(due)) }
        func due(_ element: Int) -> Int { element < 0 ? 2_500 : dues[element] }
        var taken: [Int] = []
        for step in stride(from: 0, to: 5_000, by: 250) {
            let batch = Array(queue.takeDue(at: start + .milliseconds(step)))
            #expect(batch.allSatisfy { due($0) <= step })
            taken += batch
            // Later arrivals go behind what is already due at the same time.
            if step == 2_000 { queue.insert(-1, due: start + .milliseconds(2_500)) }
        }
        taken += queue.takeDue(at: nil)
        #expect(queue.isEmpty && queue.firstDue == nil)
        #expect(taken.count == 5_001 && Set(taken).count == 5_001)
        let order = taken.map(due)
        #expect(order == order.sorted())
        #expect(taken.firstIndex(of: -1) == taken.lastIndex { $0 >= 0 && due($0) == 2_500 }.map { $0 + 1 })
    }

    @Test("a delay longer than the client's timeout: the client gives up and nothing is recorded")
    func delayBeyondClientTimeout() async throws {
        let harness = try Harness()
        try harness.simulator.setRules([.delay(tokenPrefix: "51", milliseconds: 3000)])
        let push = try harness.alert(deviceToken("51"))
        let started = ContinuousClock.now
        let result = try await curlResult(harness, [push], extra: ["--max-time", "1"])
        let elapsed = ContinuousClock.now - started
        await harness.stop()
        #expect(result.result.status == 28)
        #expect(elapsed < .seconds(3))
        #expect(try harness.accepted().isEmpty)
    }

    @Test("rules documents are strict")
    func ruleParsing() throws {
        let rules = try SimulatorRule.parse(Data(#"""
            {"rules": [{"tokenPrefix": "AB", "status": 429, "reason": "TooManyRequests", "times": 3, "delayMs": 10},
                       {"reset": true}, {"goawayAfterStreams": 5, "goawayReason": "Shutdown"}]}
            """#.utf8))
        #expect(rules == [
            SimulatorRule(tokenPrefix: "ab", times: 3, status: 429, reason: "TooManyRequests", delayMilliseconds: 10),
            .resetConnection(tokenPrefix: nil), .goaway(afterStreams: 5, reason: "Shutdown"),
        ])
        let invalid = [
            #"{"rules": [{"tokenPrefix": "ab", "stauts": 410, "reason": "Unregistered"}]}"#,
            #"{"rules": [{"status": 410}]}"#,
            #"{"rules": [{"status": 200, "reason": "OK"}]}"#,
            #"{"rules": [{"tokenPrefix": "xyz", "status": 400, "reason": "BadDeviceToken"}]}"#,
            #"{"rules": [{"tokenPrefix": "ab"}]}"#,
            #"{"rules": [{"goawayAfterStreams": 2, "tokenPrefix": "ab"}]}"#,
            #"{"rules": [{"status": 503, "reason": "Shutdown", "timestamp": 1}]}"#,
            #"{"rules": [{"reset": true, "delayMs": 5}]}"#,
            #"{"rules": [{"status": 500, "reason": "InternalServerError", "times": 0}]}"#,
            #"{"rule": []}"#,
            #"[]"#,
        ]
        for document in invalid {
            #expect(throws: ConfigurationError.self, "\(document)") { try SimulatorRule.parse(Data(document.utf8)) }
        }
    }

    @Test("a connection serves one team, and the token refresh rule compares issue times per key")
    func tokenTracker() {
        var tracker = ProviderTokenTracker(minimumInterval: .seconds(1200))
        let first = VerifiedToken(token: "a", teamID: "T", keyID: "K", issuedAt: 1000)
        let sequence = [
            first, first,
            VerifiedToken(token: "b", teamID: "T", keyID: "K", issuedAt: 2000),
            VerifiedToken(token: "c", teamID: "T", keyID: "OTHER", issuedAt: 1001),
            VerifiedToken(token: "d", teamID: "T", keyID: "K", issuedAt: 2200),
            first,
            VerifiedToken(token: "e", teamID: "OTHERTEAM", keyID: "K2", issuedAt: 3000),
        ]
        let answers = sequence.map { tracker.refusal(of: $0)?.description }
        #expect(answers == [nil, nil, "429 TooManyProviderTokenUpdates", nil, nil, "429 TooManyProviderTokenUpdates",
                            "403 UnrelatedKeyIdInToken"])
    }
}
