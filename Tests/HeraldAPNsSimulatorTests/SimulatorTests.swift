import Foundation
import HeraldAPNsSimulator
import HeraldCrypto
import HeraldRuntime
import Testing

@Suite("APNs simulator over HTTP/2")
struct SimulatorTests {
    @Test("a valid alert push gets 200 with an apns-id and is recorded")
    func validAlertPush() async throws {
        let harness = try Harness()
        let token = deviceToken()
        let chosenID = UUID().uuidString.lowercased()
        let jwt = harness.providerToken
        let responses = try await curl(harness, [
            try harness.alert(token, jwt: jwt, extra: [("apns-priority", "5"), ("apns-expiration", "1900000000"),
                                                       ("apns-collapse-id", "order-42")]),
            try harness.alert(token, jwt: jwt, extra: [("apns-id", chosenID)]),
        ])
        await harness.stop()
        try #require(responses.count == 2)
        #expect(responses[0].status == 200)
        #expect(responses[0].body.isEmpty)
        #expect(isLowercaseUUID(responses[0].headers["apns-id"]))
        #expect(responses[1].status == 200)
        #expect(responses[1].headers["apns-id"] == chosenID)
        #expect(!responses[1].newConnection)

        let records = try harness.accepted()
        try #require(records.count == 2)
        let first = records[0]
        #expect(first["status"] == .number(200))
        #expect(first["token"]?.stringValue == token)
        #expect(first["topic"]?.stringValue == bundleID)
        #expect(first["pushType"]?.stringValue == "alert")
        #expect(first["priority"] == .number(5))
        #expect(first["expiration"] == .number(1_900_000_000))
        #expect(first["collapseId"]?.stringValue == "order-42")
        #expect(first["apnsId"]?.stringValue == responses[0].headers["apns-id"])
        #expect(first["payload"] == .object(["aps": .object(["alert": .object(["title": .string("Hello")])])]))
        #expect(records[1]["apnsId"]?.stringValue == chosenID)
        #expect(records[1]["priority"] == .number(10))
        #expect(records[1]["expiration"] == .null)
        #expect(harness.simulator.statistics.accepted == 2)
    }

    @Test("a device token belongs to the topic it was first pushed to: another topic gets 400 DeviceTokenNotForTopic")
    func tokenBelongsToItsTopic() async throws {
        let harness = try Harness()
        let token = deviceToken(), liveActivityToken = deviceToken()
        func liveActivity(_ token: String) throws -> HTTPRequest {
            try harness.alert(token, body: #"{"aps":{"timestamp":1700000000,"event":"update","content-state":{}}}"#)
                .with("apns-topic", bundleID + ".push-type.liveactivity").with("apns-push-type", "liveactivity")
        }
        let responses = try await curl(harness, [
            try harness.alert(token), try liveActivity(token), try liveActivity(liveActivityToken),
            try harness.alert(liveActivityToken), try harness.alert(token),
        ])
        await harness.stop()
        #expect(responses.map(\.status) == [200, 400, 200, 400, 200])
        #expect(responses.map(\.reason) == [nil, "DeviceTokenNotForTopic", nil, "DeviceTokenNotForTopic", nil])
    }

    @Test("a team's provider token pushes only to its own bundle ids and manages only their channels")
    func teamsOwnTheirTopics() async throws {
        let rival = "com.example.rival", shared = "com.example.shared"
        let harness = try Harness(topics: [bundleID, rival, shared]) { configuration in
            configuration.topicOwners = [bundleID: [teamID], rival: ["RIVALTEAM1"]]
        }
        func list(_ bundle: String) -> HTTPRequest {
            HTTPRequest(method: "GET", path: harness.manageBase + "/1/apps/\(bundle)/all-channels",
                        headers: [("authorization", "bearer " + harness.providerToken)], body: nil)
        }
        var broadcast = try harness.alert(deviceToken()).with("apns-topic", nil).with("apns-push-type", "liveactivity")
            .with("apns-channel-id", "AAAAAAAAAAAAAAAAAAAAAA==")
        broadcast.path = "/4/broadcasts/apps/" + rival
        let cases: [(String, HTTPRequest, Int, String?)] = [
            ("own bundle", try harness.alert(deviceToken()), 200, nil),
            ("another team's bundle", try harness.alert(deviceToken()).with("apns-topic", rival), 400, "TopicDisallowed"),
            ("a bundle of no team", try harness.alert(deviceToken()).with("apns-topic", shared), 200, nil),
            ("own channels", list(bundleID), 200, nil),
            ("another team's channels", list(rival), 403, "TopicMismatch"),
            ("a broadcast to another team's channel", broadcast, 403, "TopicMismatch"),
        ]
        // Pushes answer with apns-id, channel requests with apns-request-id: ids are checked by the other tests.
        try await expectAnswers(harness, cases, idHeader: nil)
    }

    @Test("provider token problems get Apple's 403 reasons")
    func providerTokenRejections() async throws {
        let harness = try Harness()
        let token = deviceToken()
        let otherKey = try PrivateKey.generateP256()
        let valid = try harness.jwt()
        let parts = valid.split(separator: ".")
        let requests = [
            try harness.alert(token).with("authorization", nil),
            try harness.alert(token, jwt: try harness.jwt(age: 3700)),
            try harness.alert(token, jwt: try harness.jwt(age: -600)),
            try harness.alert(token, jwt: try harness.jwt(kid: "UNKNOWN123")),
            try harness.alert(token, jwt: try harness.jwt(iss: "OTHERTEAM1")),
            try harness.alert(token, jwt: try harness.jwt(key: otherKey)),
            try harness.alert(token, jwt: parts[0] + "." + parts[1] + "." + Base64URL.encode([UInt8](repeating: 1, count: 64))),
            try harness.alert(token, jwt: "not-a-jwt"),
            try harness.alert(token).with("authorization", "Basic \(valid)"),
            try harness.alert(token, jwt: try JSONWebToken.sign(claims: ["iss": .string(teamID)], keyID: keyID,
                                                                 key: harness.key)),
            try harness.alert(token, jwt: try harness.jwt(age: 3500)),
        ]
        let responses = try await curl(harness, requests)
        await harness.stop()
        try #require(responses.count == requests.count)
        let expected: [(Int, String?)] = [
            (403, "MissingProviderToken"), (403, "ExpiredProviderToken"), (403, "InvalidProviderToken"),
            (403, "InvalidProviderToken"), (403, "InvalidProviderToken"), (403, "InvalidProviderToken"),
            (403, "InvalidProviderToken"), (403, "InvalidProviderToken"), (403, "InvalidProviderToken"),
            (403, "InvalidProviderToken"), (200, nil),
        ]
        for (index, (status, reason)) in expected.enumerated() {
            #expect(responses[index].status == status, "request \(index)")
            #expect(responses[index].reason == reason, "request \(index)")
            #expect(isLowercaseUUID(responses[index].headers["apns-id"]), "request \(index)")
        }
        #expect(try harness.accepted().count == 1)
        #expect(try harness.rejected().count == 10)
    }

    @Test("one token per key across connections: a second token issued within 20 minutes of the first gets 429")
    func oneProviderTokenPerKeyAcrossConnections() async throws {
        let harness = try Harness()
        let first = try harness.jwt(age: 1500)
        let ownToken = try harness.jwt(age: 1490) // another instance signing its own, 10 s later
        let renewed = try harness.jwt()          // 25 minutes after the first: a proper renewal
        var statuses: [Int] = []
        for jwt in [first, ownToken, renewed, first] {
            let responses = try await curl(harness, [try harness.alert(deviceToken(), jwt: jwt)]) // a connection each
            statuses += responses.map(\.status)
        }
        await harness.stop()
        #expect(statuses == [200, 429, 200, 200])
    }

    @Test("switching provider tokens more often than every 20 minutes on a connection gets 429")
    func tooManyProviderTokenUpdates() async throws {
        let harness = try Harness()
        let token = deviceToken()
        let old = try harness.jwt(age: 1500)
        let sameSecond = try harness.jwt(age: 1500)
        let fresh = try harness.jwt()
        let responses = try await curl(harness, [
            try harness.alert(token, jwt: old),
            try harness.alert(token, jwt: sameSecond),
            try harness.alert(token, jwt: old),
            try harness.alert(token, jwt: fresh),
            try harness.alert(token, jwt: old),
        ])
        await harness.stop()
        try #require(responses.count == 5)
        #expect(responses.dropFirst().allSatisfy { !$0.newConnection })
        #expect(responses[0].status == 200)
        // Another token minted in the same second (two instances each minting their own): refused.
        #expect(responses[1].status == 429)
        #expect(responses[1].reason == "TooManyProviderTokenUpdates")
        #expect(responses[2].status == 200)
        // A token issued 25 minutes after the connection's current one is a proper refresh.
        #expect(responses[3].status == 200)
        // Going back to the older token is a switch again.
        #expect(responses[4].status == 429)
    }

    @Test("a connection serves the team of its first provider token: another team's gets 403 UnrelatedKeyIdInToken")
    func oneTeamPerConnection() async throws {
        let otherKey = try PrivateKey.generateP256()
        let harness = try Harness { configuration in
            configuration.providerKeys.append(ProviderKey(teamID: "OTHERTEAM1", keyID: "OTHERKEY01",
                                                          publicKey: otherKey.publicKey))
        }
        let otherTeam = try harness.jwt(kid: "OTHERKEY01", iss: "OTHERTEAM1", key: otherKey)
        let responses = try await curl(harness, [try harness.alert(deviceToken()),
                                                 try harness.alert(deviceToken(), jwt: otherTeam)])
        let alone = try await curl(harness, [try harness.alert(deviceToken(), jwt: otherTeam)])
        await harness.stop()
        try #require(responses.count == 2 && alone.count == 1)
        #expect(!responses[1].newConnection)
        #expect(responses.map(\.status) == [200, 403])
        #expect(responses[1].reason == "UnrelatedKeyIdInToken")
        #expect(alone[0].status == 200, "on its own connection")
    }

    @Test("each header rule gets Apple's status and reason")
    func headerRules() async throws {
        let harness = try Harness()
        let token = deviceToken()
        let jwt = harness.providerToken
        let push = try harness.alert(token, jwt: jwt)
        func path(_ value: String) -> HTTPRequest { var request = push; request.path = value; return request }
        var get = push
        get.method = "GET"
        get.body = nil
        var empty = push
        empty.body = nil
        let background = push.with("apns-push-type", "background")
        var backgroundOK = background.with("apns-priority", "5")
        backgroundOK.body = #"{"aps":{"content-available":1}}"#
        var voip = path("/3/device/" + deviceToken()).with("apns-push-type", "voip").with("apns-topic", bundleID + ".voip")
        voip.body = #"{"call":""# + String(repeating: "x", count: 4990) + #""}"#
        var bigAlert = push
        bigAlert.body = #"{"aps":{"alert":""# + String(repeating: "x", count: 4080) + #""}}"#
        var duplicated = push
        duplicated.headers.append(("apns-topic", bundleID))

        let cases: [(String, HTTPRequest, Int, String?)] = [
            ("GET", get, 405, "MethodNotAllowed"),
            ("bad path", path("/3/devices/" + token), 404, "BadPath"),
            ("other version", path("/2/device/" + token), 404, "BadPath"),
            ("no token", path("/3/device/"), 400, "MissingDeviceToken"),
            ("non-hex token", path("/3/device/" + String(repeating: "zz", count: 32)), 400, "BadDeviceToken"),
            ("odd-length token", path("/3/device/" + token + "a"), 400, "BadDeviceToken"),
            ("short token", path("/3/device/" + String(token.prefix(62))), 400, "BadDeviceToken"),
            ("101-byte token", path("/3/device/" + deviceToken(bytes: 101)), 400, "BadDeviceToken"),
            ("100-byte token", path("/3/device/" + deviceToken(bytes: 100)), 200, nil),
            ("missing topic", push.with("apns-topic", nil), 400, "MissingTopic"),
            ("malformed topic", push.with("apns-topic", "com example"), 400, "BadTopic"),
            ("other bundle", push.with("apns-topic", "com.example.other"), 400, "TopicDisallowed"),
            ("missing push type", push.with("apns-push-type", nil), 400, "InvalidPushType"),
            ("unknown push type", push.with("apns-push-type", "banner"), 400, "InvalidPushType"),
            ("voip push to the bare topic", push.with("apns-push-type", "voip"), 400, "InvalidPushType"),
            ("alert push to a live activity topic", push.with("apns-topic", bundleID + ".push-type.liveactivity"),
             400, "InvalidPushType"),
            ("priority 7", push.with("apns-priority", "7"), 400, "BadPriority"),
            ("background at priority 10", background, 400, "BadPriority"),
            ("background at priority 5", backgroundOK, 200, nil),
            ("content-available alone as an alert at priority 10", { var r = push; r.body = backgroundOK.body; return r }(),
             400, "BadPriority"),
            ("content-available alone as an alert at priority 5",
             { var r = push.with("apns-priority", "5"); r.body = backgroundOK.body; return r }(), 200, nil),
            ("expiration not a number", push.with("apns-expiration", "tomorrow"), 400, "BadExpirationDate"),
            ("collapse id of 65 bytes", push.with("apns-collapse-id", String(repeating: "c", count: 65)), 400,
             "BadCollapseId"),
            ("collapse id of 64 bytes", push.with("apns-collapse-id", String(repeating: "c", count: 64)), 200, nil),
            ("apns-id not a UUID", push.with("apns-id", "12345"), 400, "BadMessageId"),
            ("uppercase apns-id", push.with("apns-id", UUID().uuidString.uppercased()), 400, "BadMessageId"),
            ("duplicate topic", duplicated, 400, "DuplicateHeaders"),
            ("empty payload", empty, 400, "PayloadEmpty"),
            ("payload not JSON", { var r = push; r.body = "hello"; return r }(), 400, "BadPayload"),
            ("payload an array", { var r = push; r.body = "[1]"; return r }(), 400, "BadPayload"),
            ("alert without aps", { var r = push; r.body = #"{"alert":"x"}"#; return r }(), 400, "BadPayload"),
            ("background without content-available", { var r = backgroundOK; r.body = #"{"aps":{}}"#; return r }(),
             400, "BadPayload"),
            ("alert payload over 4096 bytes", bigAlert, 413, "PayloadTooLarge"),
            ("voip payload of 5000 bytes", voip, 200, nil),
        ]
        try await expectAnswers(harness, cases, idHeader: "apns-id")
        #expect(bigAlert.body!.utf8.count > 4096)
        let rejected = try harness.rejected()
        #expect(rejected.count == cases.filter { $0.2 != 200 }.count)
        #expect(rejected.first?["reason"]?.stringValue == "MethodNotAllowed")
        #expect(try harness.accepted().count == cases.filter { $0.2 == 200 }.count)
    }

    @Test("a configured bundle id ending like a push type's topic suffix (.voip) takes alerts as it is")
    func bundleEndingLikeASuffix() async throws {
        let phone = "com.example.phone.voip"
        let harness = try Harness(topics: [bundleID, phone])
        var voip = try harness.alert(deviceToken()).with("apns-topic", phone + ".voip").with("apns-push-type", "voip")
        voip.body = #"{"call":"1"}"#
        try await expectAnswers(harness, [
            ("alert to the bundle id", try harness.alert(deviceToken()).with("apns-topic", phone), 200, nil),
            ("voip to its .voip topic", voip, 200, nil),
            ("alert to a .voip topic that is no bundle id", try harness.alert(deviceToken()).with("apns-topic", bundleID + ".voip"),
             400, "InvalidPushType"),
        ], idHeader: "apns-id")
    }

    @Test("Live Activity pushes need timestamp, event and content-state; push-to-start needs attributes")
    func liveActivityPayloads() async throws {
        let harness = try Harness()
        let token = deviceToken()
        let base = try harness.alert(token).with("apns-push-type", "liveactivity")
            .with("apns-topic", bundleID + ".push-type.liveactivity")
        func body(_ text: String) -> HTTPRequest { var request = base; request.body = text; return request }
        let now = Int(Date().timeIntervalSince1970)
        let cases: [(String, Int, String?)] = [
            (#"{"aps":{"timestamp":\#(now),"event":"update","content-state":{"status":"shipped"}}}"#, 200, nil),
            (#"{"aps":{"timestamp":\#(now),"event":"end","content-state":{},"dismissal-date":\#(now + 60)}}"#, 200, nil),
            (#"{"aps":{"timestamp":\#(now),"event":"start","content-state":{},"attributes-type":"OrderAttributes","attributes":{"id":"1"},"alert":{"title":"t","body":"b"}}}"#, 200, nil),
            (#"{"aps":{"event":"update","content-state":{}}}"#, 400, "BadPayload"),
            (#"{"aps":{"timestamp":"now","event":"update","content-state":{}}}"#, 400, "BadPayload"),
            (#"{"aps":{"timestamp":\#(now),"content-state":{}}}"#, 400, "BadPayload"),
            (#"{"aps":{"timestamp":\#(now),"event":"pause","content-state":{}}}"#, 400, "BadPayload"),
            (#"{"aps":{"timestamp":\#(now),"event":"update"}}"#, 400, "BadPayload"),
            (#"{"aps":{"timestamp":\#(now),"event":"end"}}"#, 400, "BadPayload"),
            (#"{"aps":{"timestamp":\#(now),"event":"start","content-state":{},"attributes":{}}}"#, 400, "BadPayload"),
            (#"{"aps":{"timestamp":\#(now),"event":"start","content-state":{},"attributes-type":"A"}}"#, 400, "BadPayload"),
            (#"{"aps":{"timestamp":\#(now),"event":"update","content-state":{},"stale-date":"soon"}}"#, 400, "BadPayload"),
        ]
        let update = body(cases[0].0)
        let responses = try await curl(harness, cases.map { body($0.0) } + [
            base.with("apns-topic", bundleID),
            update.with("apns-priority", "1"),
            update.with("apns-priority", "5"),
        ])
        await harness.stop()
        try #require(responses.count == cases.count + 3)
        for (index, (payload, status, reason)) in cases.enumerated() {
            #expect(responses[index].status == status, "\(payload)")
            #expect(responses[index].reason == reason, "\(payload)")
        }
        #expect(responses[cases.count].reason == "InvalidPushType")
        // Live Activity pushes to devices take priority 10 or 5, not 1.
        #expect(responses[cases.count + 1].status == 400 && responses[cases.count + 1].reason == "BadPriority")
        #expect(responses[cases.count + 2].status == 200)
        let records = try harness.accepted()
        #expect(records.map { $0["pushType"]?.stringValue } == ["liveactivity", "liveactivity", "liveactivity", "liveactivity"])
        #expect(records.first?["topic"]?.stringValue == bundleID + ".push-type.liveactivity")
        #expect(records.first?["payload"]?["aps"]?["content-state"] == .object(["status": .string("shipped")]))
    }

    @Test("push-to-start takes iOS 18's input-push-channel (a string) and input-push-token (1, or 0)")
    func pushToStartInputs() async throws {
        let harness = try Harness()
        let base = try harness.alert(deviceToken()).with("apns-push-type", "liveactivity")
            .with("apns-topic", bundleID + ".push-type.liveactivity")
        let now = Int(Date().timeIntervalSince1970)
        func start(_ inputs: String) -> HTTPRequest {
            var request = base
            request.body = #"{"aps":{"timestamp":\#(now),"event":"start","content-state":{},"attributes-type":"A","attributes":{},"alert":{"title":"t"},\#(inputs)}}"#
            return request
        }
        let cases: [(String, Int, String?)] = [
            (#""input-push-channel":"dHN0LTEyMzQ1Njc4OTAxMjM0NTY=","input-push-token":1"#, 200, nil),
            (#""input-push-token":0"#, 200, nil),
            (#""input-push-token":"yes""#, 400, "BadPayload"),
            (#""input-push-token":true"#, 400, "BadPayload"),
            (#""input-push-token":2"#, 400, "BadPayload"),
            (#""input-push-channel":7"#, 400, "BadPayload"),
        ]
        let responses = try await curl(harness, cases.map { start($0.0) })
        await harness.stop()
        try #require(responses.count == cases.count)
        for (index, (inputs, status, reason)) in cases.enumerated() {
            #expect(responses[index].status == status, "\(inputs)")
            #expect(responses[index].reason == reason, "\(inputs)")
        }
        let aps = try harness.accepted().first?["payload"]?["aps"]
        #expect(aps?["input-push-channel"] == .string("dHN0LTEyMzQ1Njc4OTAxMjM0NTY=") && aps?["input-push-token"] == .number(1))
    }

    @Test("max concurrent streams is 1 until a valid provider token is used, then the configured value")
    func maxConcurrentStreams() async throws {
        let harness = try Harness(maxConcurrentStreams: 250)
        let token = deviceToken()
        let headers = try harness.alert(token).headers
        let body = #"{"aps":{"alert":"x"}}"#
        // nghttp sends a URI once: two tokens make two streams.
        let valid = try await nghttp(harness, paths: ["/3/device/" + token, "/3/device/" + deviceToken()],
                                     headers: headers, body: body)
        var invalidHeaders = headers
        invalidHeaders[0] = ("authorization", "bearer " + (try harness.jwt(key: try PrivateKey.generateP256())))
        let invalid = try await nghttp(harness, paths: ["/3/device/" + token], headers: invalidHeaders, body: body)
        await harness.stop()

        let settings = { (log: String) in
            log.split(separator: "\n").filter { $0.contains("SETTINGS_MAX_CONCURRENT_STREAMS") }
        }
        let received = { (log: String) -> [String] in
            var values: [String] = []
            var receiving = false
            for line in log.split(separator: "\n") {
                if line.contains("SETTINGS frame") { receiving = line.contains("recv SETTINGS") }
                if receiving, line.contains("SETTINGS_MAX_CONCURRENT_STREAMS"),
                   let value = line.split(separator: ":").last?.dropLast() {
                    values.append(String(value))
                }
            }
            return values
        }
        #expect(!settings(valid).isEmpty)
        #expect(received(valid) == ["1", "250"])
        // A second stream the client opened before it saw the limit of 1 is refused (REFUSED_STREAM), as the
        // limit demands; nghttp does not retry it.
        let answered = valid.components(separatedBy: ":status: 200").count - 1
        let refused = valid.components(separatedBy: "error_code=REFUSED_STREAM").count - 1
        #expect(answered >= 1)
        #expect(answered + refused == 2, "\(valid)")
        #expect(received(invalid) == ["1"])
        #expect(invalid.contains(":status: 403"))
    }

    @Test("the generated CA verifies the server; untrusted clients, HTTP/1.1 and TLS 1.1 are refused")
    func tlsRules() async throws {
        let harness = try Harness()
        let push = try harness.alert(deviceToken())
        let trusted = try await curl(harness, [push])
        let untrusted = try await curlResult(harness, [push], cacert: false)
        let otherCA = try SimulatorCertificates.generate(directory: harness.directory + "/other")
        let wrongCA = try await curlResult(harness, [push], extra: ["--cacert", otherCA.caCertificate], cacert: false)
        let http11 = try await curlResult(harness, [push], extra: ["--http1.1"])
        let tls11 = try await run("/usr/bin/openssl", [
            "s_client", "-connect", "127.0.0.1:\(harness.simulator.port)", "-tls1_1", "-alpn", "h2",
        ])
        let tls12 = try await run("/usr/bin/openssl", [
            "s_client", "-connect", "127.0.0.1:\(harness.simulator.port)", "-tls1_2", "-alpn", "h2",
            "-CAfile", harness.files.caCertificate, "-verify_return_error", "-verify_hostname", "localhost",
        ])
        let verify = try await run("/usr/bin/openssl", ["verify", "-CAfile", harness.files.caCertificate,
                                                        harness.files.serverCertificate])
        await harness.stop()
        #expect(trusted.first?.status == 200)
        #expect(untrusted.result.status == 60, "curl without the CA: \(untrusted.result.stderr)")
        #expect(untrusted.responses.isEmpty)
        #expect(wrongCA.result.status == 60)
        #expect(http11.result.status != 0, "ALPN http/1.1 must be refused")
        #expect(http11.responses.isEmpty)
        #expect(tls11.status != 0)
        #expect(tls12.stdout.contains("ALPN protocol: h2"))
        #expect(tls12.stdout.contains("Verify return code: 0 (ok)"))
        #expect(verify.status == 0)
        #expect(try harness.accepted().count == 1)
    }
}
