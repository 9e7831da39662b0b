import Foundation
import HeraldCore
import HeraldCrypto
import HeraldTestSupport
import HeraldRuntime
import Testing

@Suite struct PushJobTests {
    @Test func channelEventBecomesAValidJobWithItsRecordKey() throws {
        let job = try EventIntake.channelEvent(json("""
            {"channel": "order:42:status", "alert": {"aps": {"alert": {"title": "Shipped"}}, "orderId": 42},
             "liveActivity": {"event": "update", "contentState": {"status": "shipped"}, "staleDate": 1900000000},
             "priority": 5, "collapseId": "order-42"}
            """), appID: "shop", jobID: nil)
        #expect(job.recordKey == "shop/order:42:status")
        #expect(job.alert?["orderId"] == .number(42))
        #expect(job.liveActivity?.event == .update && job.priority == 5)
        let decoded = try PushJob.decode(job.encoded())
        #expect(decoded == job)
        try decoded.validate()
    }

    @Test func clientIDMakesTheJobID() throws {
        let body = json(#"{"channel": "c", "alert": {"aps": {}}, "id": "evt-1"}"#)
        #expect(try EventIntake.channelEvent(body, appID: "shop", jobID: nil).id == "evt-1")
        let header = json(#"{"channel": "c", "alert": {"aps": {}}}"#)
        #expect(try EventIntake.channelEvent(header, appID: "shop", jobID: "idem-9").id == "idem-9")
    }

    @Test(arguments: [
        (#"{"channel": "c"}"#, "alert"),
        (#"{"channel": "c", "alert": {"title": "no aps"}}"#, "alert"),
        (#"{"channel": "c", "alert": {"aps": {}}, "priority": 7}"#, "priority"),
        (#"{"channel": "c", "alert": {"aps": {}}, "collapseId": "\#(String(repeating: "x", count: 65))"}"#, "collapseId"),
        (#"{"channel": "c", "liveActivity": {"event": "pause", "contentState": {}}}"#, "liveActivity.event"),
        (#"{"channel": "c", "liveActivity": {"event": "update"}}"#, "liveActivity.contentState"),
        (#"{"channel": "c", "start": {"attributesType": "T", "attributes": {}, "contentState": {}}}"#, "start.alert"),
        (#"{"channel": "c", "start": {"attributesType": "T", "attributes": {}, "contentState": {}, "alert": {}, "inputPushChannel": "not base64!"}}"#, "start.inputPushChannel"),
        (#"{"channel": "c", "start": {"attributesType": "T", "attributes": {}, "contentState": {}, "alert": {}, "inputPushChannel": 7}}"#, "start.inputPushChannel"),
        (#"{"channel": "c", "start": {"attributesType": "T", "attributes": {}, "contentState": {}, "alert": {}, "inputPushToken": 1}}"#, "start.inputPushToken"),
        (#"{"channel": "c", "alert": {"aps": {"alert": "\#(String(repeating: "x", count: 4100))"}}}"#, "alert"),
    ])
    func rejectsBadChannelEvents(body: String, field: String) {
        #expect { try EventIntake.channelEvent(json(body), appID: "shop", jobID: nil) } throws: {
            ($0 as? ValidationError)?.field == field
        }
    }

    @Test func activityEventsAndDevicePushes() throws {
        let end = try EventIntake.activityEvent(json(#"{"event": "end", "contentState": {"done": true}}"#),
                                                appID: "shop", postIDHash: "deadbeef", jobID: nil)
        #expect(end.recordKey == "shop/post/deadbeef" && end.isFinal)
        #expect(throws: ValidationError.self) {
            try EventIntake.activityEvent(json(#"{"event": "update", "contentState": {}}"#), appID: "shop",
                                          postIDHash: "NOTHEX!", jobID: nil)
        }
        let push = try EventIntake.devicePush(json(#"{"payload": {"aps": {"content-available": 1}}, "pushType": "background", "priority": 5}"#),
                                              appID: "shop", deviceToken: token.uppercased(), jobID: nil)
        #expect(push.recordKey == "shop/device/\(SHA256.hex(token))" && push.resolvedPushType == .background)
        #expect(throws: ValidationError.self) {
            try EventIntake.devicePush(json(#"{"payload": {"aps": {}}, "pushType": "background", "priority": 10}"#),
                                       appID: "shop", deviceToken: token, jobID: nil)
        }
    }

    /// A payload whose aps has only content-available wakes the app: without a pushType it goes as a background
    /// push (default priority 5), and priority 10, an error at Apple for it, is refused at intake.
    @Test func aPayloadThatOnlyWakesTheAppIsABackgroundPush() throws {
        let silent = #"{"aps": {"content-available": 1}, "sync": "inbox"}"#
        let push = try EventIntake.devicePush(json(#"{"payload": \#(silent)}"#), appID: "shop", deviceToken: token, jobID: nil)
        #expect(push.resolvedPushType == .background)
        let audible = try EventIntake.devicePush(json(#"{"payload": {"aps": {"content-available": 1, "sound": "ping.aiff"}}}"#),
                                                 appID: "shop", deviceToken: token, jobID: nil)
        #expect(audible.resolvedPushType == .alert)
        let insisted = try EventIntake.devicePush(json(#"{"payload": \#(silent), "pushType": "alert"}"#),
                                                  appID: "shop", deviceToken: token, jobID: nil)
        #expect(insisted.resolvedPushType == .alert)
        let cases = [
            { try EventIntake.devicePush(json(#"{"payload": \#(silent), "priority": 10}"#), appID: "shop", deviceToken: token, jobID: nil) },
            { try EventIntake.devicePush(json(#"{"payload": \#(silent), "pushType": "alert", "priority": 10}"#), appID: "shop", deviceToken: token, jobID: nil) },
            { try EventIntake.channelEvent(json(#"{"channel": "c", "alert": \#(silent), "priority": 10}"#), appID: "shop", jobID: nil) },
        ]
        for make in cases {
            #expect(throws: ValidationError.self) { try make() }
        }
        // The schema says the same.
        var device = push
        device.priority = 10
        #expect(throws: (any Error).self) { try validateAgainstSchema([device.encoded()], schema: "push-job.schema.json") }
        device.pushType = "alert"
        #expect(throws: (any Error).self) { try validateAgainstSchema([device.encoded()], schema: "push-job.schema.json") }
        device.priority = 5
        try validateAgainstSchema([device.encoded()], schema: "push-job.schema.json")
        var channel = PushJob(id: "j", appId: "shop", target: .channel("c"))
        channel.alert = json(silent)
        try validateAgainstSchema([channel.encoded()], schema: "push-job.schema.json")
        channel.priority = 10
        #expect(throws: (any Error).self) { try validateAgainstSchema([channel.encoded()], schema: "push-job.schema.json") }
    }

    /// A Live Activity device payload is measured as sent, with the `aps.timestamp` Herald adds when it is missing:
    /// one that fits only without it is refused at intake, not accepted and then refused by APNs' 4096-byte limit.
    @Test func aLiveActivityPayloadIsMeasuredWithItsTimestamp() throws {
        func push(stateBytes: Int) throws -> PushJob {
            let state = String(repeating: "x", count: stateBytes)
            return try EventIntake.devicePush(json(#"{"payload": {"aps": {"event": "update", "content-state": {"s": "\#(state)"}}}, "tokenType": "liveactivity-update"}"#),
                                              appID: "shop", deviceToken: token, jobID: nil)
        }
        let bare = try push(stateBytes: 0).payload!.encoded().count
        #expect(throws: Never.self) { try push(stateBytes: 4096 - 23 - bare) } // 23: `,"timestamp":1767225600`
        let error = #expect(throws: ValidationError.self) { try push(stateBytes: 4090 - bare) } // 4,090 bytes as written
        #expect(error?.code == "payload_too_large", "\(String(describing: error))")
    }

    @Test func liveActivityPayloadCarriesApplesFields() {
        let content = PushJob.LiveActivity(event: .update, contentState: json(#"{"s": 1}"#), alert: nil, staleDate: 10,
                                           dismissalDate: nil, relevanceScore: 0.5, activityID: nil)
        let aps = APNsPayload.liveActivity(content, timestamp: 1_700_000_000)["aps"]
        #expect(aps?["timestamp"] == .number(1_700_000_000) && aps?["event"] == .string("update"))
        #expect(aps?["content-state"] == json(#"{"s": 1}"#) && aps?["stale-date"] == .number(10))
        #expect(aps?["relevance-score"] == .number(0.5) && aps?["dismissal-date"] == nil)
    }

    /// iOS 18 push-to-start inputs: taken from the event, written and read back as given, sent in `aps` (the
    /// token only when true), the channel id held to the rule of APNs channel ids.
    @Test func pushToStartInputs() throws {
        let channelID = "dHN0LTEyMzQ1Njc4OTAxMjM0NTY="
        let job = try EventIntake.channelEvent(json("""
            {"channel": "c", "start": {"attributesType": "T", "attributes": {}, "contentState": {}, "alert": {"title": "t"},
             "inputPushChannel": "\(channelID)", "inputPushToken": true}}
            """), appID: "shop", jobID: nil)
        let start = try #require(job.start)
        #expect(start.inputPushChannel == channelID && start.inputPushToken == true)
        #expect(try PushJob.decode(job.encoded()) == job)
        let aps = APNsPayload.start(start, timestamp: 1)["aps"]
        #expect(aps?["input-push-channel"] == .string(channelID) && aps?["input-push-token"] == .number(1))

        var off = job
        off.start?.inputPushChannel = nil
        off.start?.inputPushToken = false
        try off.validate()
        #expect(try PushJob.decode(off.encoded()) == off)
        let bare = APNsPayload.start(try #require(off.start), timestamp: 1)["aps"]
        #expect(bare?["input-push-channel"] == nil && bare?["input-push-token"] == nil)

        for id in ["", "not base64!", "dHN0\u{e9}", String(repeating: "A", count: 257)] {
            var bad = job
            bad.start?.inputPushChannel = id
            #expect("\(id)") { try bad.validate() } throws: { ($0 as? ValidationError)?.field == "start.inputPushChannel" }
        }
        let record = String(decoding: job.encoded(), as: UTF8.self)
        for (from, to) in [(#""inputPushToken":true"#, #""inputPushToken":1"#),
                           (#""inputPushToken":true"#, #""inputPushToken":null"#),
                           (#""inputPushChannel":"\#(channelID)""#, #""inputPushChannel":7"#)] {
            let wrong = record.replacingOccurrences(of: from, with: to)
            #expect(wrong != record)
            #expect("\(to)") { try PushJob.decode(Array(wrong.utf8)) } throws: { ($0 as? ValidationError)?.code == "invalid_job" }
        }
    }

    @Test func decodingGarbageIsAnInvalidJob() throws {
        #expect { try PushJob.decode(Array("{".utf8)) } throws: { ($0 as? ValidationError)?.code == "invalid_job" }
        #expect { try PushJob.decode(Array(#"{"version": 1}"#.utf8)) } throws: { ($0 as? ValidationError)?.code == "invalid_job" }
        // A member named twice: JSONDecoder alone would keep the first `collapseId` silently.
        let twice = #"{"version": 1, "id": "j", "appId": "a", "createdAt": "2026-01-01T00:00:00.000Z", "#
            + #""target": {"kind": "channel", "channel": "c"}, "alert": {"aps": {}}, "collapseId": "a", "collapseId": "b"}"#
        #expect { try PushJob.decode(Array(twice.utf8)) } throws: { ($0 as? ValidationError)?.code == "invalid_job" }
        #expect(try PushJob.decode(Array(twice.replacingOccurrences(of: #", "collapseId": "b""#, with: "").utf8)).collapseId == "a")
    }

    /// The decoder keeps the Codable form's rules: every field round-trips; a missing required field, a wrong
    /// type, a `null` optional field or a field the format does not define (at any depth) is an invalid job.
    @Test func decodingIsStrict() throws {
        var job = PushJob(id: "j-1", appId: "shop", target: .channel("c"))
        job.alert = json(#"{"aps": {"alert": "hi"}, "n": [1, 2.5, null, true]}"#)
        job.liveActivity = PushJob.LiveActivity(event: .end, contentState: json(#"{"s": 1}"#), alert: json(#"{"title": "t"}"#),
                                                staleDate: 10, dismissalDate: 20, relevanceScore: 0.5, activityID: "a")
        job.start = PushJob.Start(attributesType: "T", attributes: json("{}"), contentState: json("{}"), alert: json("{}"))
        job.priority = 5
        job.expiration = 1_900_000_000
        job.collapseId = "k"
        job.final = true
        job.replayOf = PushJob.ReplayOf(jobId: "orig", dlqPartition: 3, dlqOffset: 12_345)
        #expect(try PushJob.decode(job.encoded()) == job)
        var device = PushJob(id: "j-2", appId: "shop", target: .device(token, tokenType: .liveActivityUpdate,
                                                                        environment: .sandbox, topic: "com.shop.push-type.liveactivity"))
        device.payload = json(#"{"aps": {}}"#)
        device.pushType = "liveactivity"
        #expect(try PushJob.decode(device.encoded()) == device)

        let base = #""version": 1, "id": "j", "appId": "shop", "createdAt": "2024-05-01T08:00:00.000Z""#
        for bad in [
            #"{\#(base)}"#, // no target
            #"{\#(base), "target": {"kind": "channel", "channel": "c"}, "alert": null}"#,
            #"{\#(base), "target": {"kind": "channel", "channel": "c"}, "collapseID": "k"}"#,
            #"{\#(base), "target": {"kind": "channel", "channel": "c", "extra": 1}}"#,
            #"{\#(base), "target": {"kind": "group", "channel": "c"}}"#,
            #"{\#(base), "target": {"kind": "channel", "channel": 7}}"#,
            #"{\#(base), "target": {"kind": "channel", "channel": "c"}, "priority": 5.5}"#,
            #"{\#(base), "target": {"kind": "channel", "channel": "c"}, "final": "yes"}"#,
            #"{\#(base), "target": {"kind": "channel", "channel": "c"}, "liveActivity": {"event": "update"}}"#,
            #"{\#(base), "target": {"kind": "channel", "channel": "c"}, "liveActivity": {"event": "update", "contentState": {}, "x": 1}}"#,
            #"{\#(base), "target": {"kind": "channel", "channel": "c"}, "replayOf": {"jobId": "o", "dlqPartition": 1}}"#,
            #"{\#(base), "target": "c"}"#,
            #"[1]"#,
        ] {
            #expect("\(bad)") { try PushJob.decode(Array(bad.utf8)) } throws: { ($0 as? ValidationError)?.code == "invalid_job" }
        }
        // A JSON value that is itself required may be null: validate() judges it.
        let nullState = #"{\#(base), "target": {"kind": "channel", "channel": "c"}, "liveActivity": {"event": "update", "contentState": null}}"#
        #expect(try PushJob.decode(Array(nullState.utf8)).liveActivity?.contentState == JSONValue.null)
    }

    /// Jobs Herald writes validate against the published JSON Schema (checked with Python's jsonschema).
    @Test func encodedJobsMatchThePublishedSchema() throws {
        let jobs = [
            try EventIntake.channelEvent(json(#"{"channel": "c", "alert": {"aps": {}}, "start": {"attributesType": "T", "attributes": {}, "contentState": {}, "alert": {"title": "t"}, "inputPushChannel": "dHN0LTEy+/_-=", "inputPushToken": true}, "expiration": 0}"#), appID: "shop", jobID: nil),
            try EventIntake.activityEvent(json(#"{"event": "update", "contentState": {}, "final": true, "relevanceScore": 1.5}"#), appID: "shop", postIDHash: "0123abcd", jobID: nil),
            try EventIntake.devicePush(json(#"{"payload": {"aps": {}}, "tokenType": "liveactivity-update", "environment": "sandbox"}"#), appID: "shop", deviceToken: token, jobID: nil),
            try EventIntake.broadcastChannel(json(#"{"environment": "sandbox", "storagePolicy": "mostRecentMessage"}"#), appID: "shop", postIDHash: "0123abcd"),
        ]
        try validateAgainstSchema(jobs.map { $0.encoded() }, schema: "push-job.schema.json")
        var both = jobs[3]
        both.liveActivity = jobs[1].liveActivity
        #expect(throws: (any Error).self) { try validateAgainstSchema([both.encoded()], schema: "push-job.schema.json") }
        var broken = jobs[0]
        broken.priority = 3
        #expect(throws: (any Error).self) { try validateAgainstSchema([broken.encoded()], schema: "push-job.schema.json") }
        var badChannel = jobs[0]
        badChannel.start?.inputPushChannel = "not base64!"
        #expect(throws: (any Error).self) { try validateAgainstSchema([badChannel.encoded()], schema: "push-job.schema.json") }
        // Priority 1: fine for alerts, refused by both for anything that sends a Live Activity push to a device.
        var lowAlert = jobs[0]
        lowAlert.start = nil
        lowAlert.priority = 1
        try lowAlert.validate()
        try validateAgainstSchema([lowAlert.encoded()], schema: "push-job.schema.json")
        for index in [0, 1, 2] {
            var low = jobs[index]
            low.priority = 1
            #expect(throws: ValidationError.self, "\(index)") { try low.validate() }
            #expect(throws: (any Error).self, "\(index)") { try validateAgainstSchema([low.encoded()], schema: "push-job.schema.json") }
        }
    }

    /// Past the schema's bounds the dispatcher refuses a job too: a date past 32-bit UNIX seconds, a negative dead
    /// letter position.
    @Test func numbersOutsideTheSchemasBoundsAreInvalidJobs() throws {
        var late = try EventIntake.activityEvent(json(#"{"event": "update", "contentState": {}}"#), appID: "shop",
                                                 postIDHash: "0123abcd", jobID: nil)
        late.liveActivity?.staleDate = Int64(UInt32.max) + 1
        #expect(throws: ValidationError.self) { try late.validate() }
        #expect(throws: (any Error).self) { try validateAgainstSchema([late.encoded()], schema: "push-job.schema.json") }
        late.liveActivity?.staleDate = Int64(UInt32.max)
        try late.validate()
        try validateAgainstSchema([late.encoded()], schema: "push-job.schema.json")
        for (partition, offset) in [(Int32(-1), Int64(0)), (0, -1)] {
            var replay = PushJob(id: "r", appId: "shop", target: .device(token, tokenType: .alert, environment: .sandbox))
            replay.payload = json(#"{"aps": {}}"#)
            replay.replayOf = PushJob.ReplayOf(jobId: "j", dlqPartition: partition, dlqOffset: offset)
            #expect("\(partition) \(offset)") { try PushJob.decode(replay.encoded()) } throws: {
                ($0 as? ValidationError)?.code == "invalid_job"
            }
            #expect(throws: (any Error).self) { try validateAgainstSchema([replay.encoded()], schema: "push-job.schema.json") }
        }
    }

    /// A failed broadcast's dead letter replays as a broadcast job: one channel, the payload as published, up to
    /// 5,120 bytes; decoded back as written, matching the schema, and refused without a payload or with a bad id.
    @Test func broadcastJobsReplayFailedBroadcasts() throws {
        var letter = DeadLetter(appId: "shop", job: nil, reason: "InternalServerError", attempts: 5)
        letter.channelId = "dHN0LTEy+/="
        letter.storagePolicy = .noStorage
        letter.environment = .sandbox
        letter.priority = 5
        letter.payload = .object(["aps": .object(["event": .string("update"), "content-state": .object(["s": .string(String(repeating: "x", count: 4500))])])])
        let job = try #require(letter.replayJob(partition: 0, offset: 7, id: "replay-x-0-7"))
        #expect(job.target == .broadcast(.init(channelId: "dHN0LTEy+/=", environment: .sandbox, storagePolicy: .noStorage)))
        #expect(job.recordKey == "shop/broadcast/dHN0LTEy+/=" && job.priority == 5 && job.payload == letter.payload)
        try job.validate()
        #expect(try PushJob.decode(job.encoded()) == job)
        #expect(try DeadLetter.decode(letter.encoded()) == letter)
        try validateAgainstSchema([job.encoded()], schema: "push-job.schema.json")
        try validateAgainstSchema([letter.encoded()], schema: "dead-letter.schema.json")
        var tooLarge = job
        tooLarge.payload = .object(["aps": .object(["s": .string(String(repeating: "x", count: 5200))])])
        #expect(throws: ValidationError.self) { try tooLarge.validate() }
        var typed = job
        typed.pushType = "liveactivity"
        #expect(throws: ValidationError.self) { try typed.validate() }
        var badID = job
        badID.target = .broadcast(.init(channelId: "not base64!", environment: .sandbox, storagePolicy: .noStorage))
        #expect(throws: ValidationError.self) { try badID.validate() }
        #expect(throws: (any Error).self) { try validateAgainstSchema([badID.encoded()], schema: "push-job.schema.json") }
        var bare = job
        bare.payload = nil
        #expect(throws: ValidationError.self) { try bare.validate() }
        letter.storagePolicy = nil
        #expect(letter.replayJob(partition: 0, offset: 7, id: "r") == nil, "no policy: nothing to replay it with")
    }

    /// A post job makes the post's broadcast channel instead of sending an update: decoded back as written, and
    /// refused with an update beside it, with `final`, or on another target.
    @Test func broadcastChannelJobs() throws {
        let job = try EventIntake.broadcastChannel(json(#"{"environment": "production"}"#), appID: "shop", postIDHash: "0123abcd")
        #expect(job.broadcastChannel == PushJob.BroadcastChannel(environment: .production, storagePolicy: .noStorage))
        #expect(try PushJob.decode(job.encoded()) == job)
        #expect(throws: ValidationError.self) {
            try EventIntake.broadcastChannel(json(#"{"environment": "production", "storagePolicy": "forever"}"#), appID: "shop", postIDHash: "0123abcd")
        }
        #expect(throws: ValidationError.self) { try EventIntake.broadcastChannel(json("{}"), appID: "shop", postIDHash: "0123abcd") }
        var both = job
        both.liveActivity = PushJob.LiveActivity(event: .update, contentState: .object([:]))
        #expect(throws: ValidationError.self) { try both.validate() }
        var final = job
        final.final = true
        #expect(throws: ValidationError.self) { try final.validate() }
        var channel = PushJob(id: "j", appId: "shop", target: .channel("c"))
        channel.alert = .object(["aps": .object([:])])
        channel.broadcastChannel = job.broadcastChannel
        #expect(throws: ValidationError.self) { try channel.validate() }
    }

    @Test func timestampsAreWrittenAsFoundationWritesThem() {
        var generator = SystemRandomNumberGenerator()
        let edges: [Double] = [0, 0.0009, 0.9999, 951_782_400.5, 951_782_400.9999, 1_709_164_799.999,
                               1_796_000_000.0005, 4_107_542_399.001, 4_107_542_399.9996, 253_402_300_799.5,
                               253_402_300_799.999, Date().timeIntervalSince1970, -1.5, 253_402_300_800]
        let random = (0..<2000).map { _ in Double.random(in: 0..<253_402_300_800, using: &generator) }
        let milliseconds = (0..<2000).map { _ in
            Double(Int.random(in: 1_700_000_000_000...1_900_000_000_000, using: &generator)) / 1000
        }
        for interval in edges + random + milliseconds {
            let date = Date(timeIntervalSince1970: interval)
            #expect(Timestamp.rfc3339(date) == Timestamp.foundationRFC3339(date), "\(interval)")
        }
    }

    /// Whole milliseconds format exactly: no millisecond lost to a `Double`'s fraction (`x.123` is `x.12299…`).
    @Test func millisecondTimestampsAreExact() {
        var generator = SystemRandomNumberGenerator()
        let edges: [Int64] = [0, 999, 1_000, 1_764_460_800_123, 1_764_460_800_999, 253_402_300_799_999]
        for ms in edges + (0..<2000).map({ _ in Int64.random(in: 0..<253_402_300_800_000, using: &generator) }) {
            let text = Timestamp.rfc3339(milliseconds: ms)
            let fraction = String(format: "%03d", Int(ms % 1000))
            #expect(text.dropFirst(20).prefix(3) == Substring(fraction), "\(ms)")
            #expect(text.prefix(19) == Timestamp.rfc3339(Date(timeIntervalSince1970: Double(ms / 1000))).prefix(19), "\(ms)")
        }
        #expect(Timestamp.rfc3339(milliseconds: -1500) == Timestamp.foundationRFC3339(Date(timeIntervalSince1970: -1.5)))
    }

    @Test func canonicalTimestampsAreOnesFoundationParses() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<500 {
            let text = Timestamp.rfc3339(Date(timeIntervalSince1970: .random(in: 0..<253_402_300_800, using: &generator)))
            #expect(Timestamp.isValid(text) && Timestamp.parse(text) != nil, "\(text)")
        }
        #expect(Timestamp.isValid("2024-02-29T23:59:59.999Z"))
        for text in ["2023-02-29T00:00:00.000Z", "2024-13-01T00:00:00.000Z", "2024-04-31T00:00:00.000Z",
                     "2024-01-01T24:00:00.000Z", "2024-01-01T00:60:00.000Z", "2024-01-01 00:00:00.000Z",
                     "2024-01-01T00:00:00.000", "yesterday", ""] {
            #expect(Timestamp.isValid(text) == (Timestamp.parse(text) != nil), "\(text)")
        }
        #expect(!Timestamp.isValid("2024-01-01T00:00:00.000"))
    }

    @Test func channelsOfPrintableASCIIOrUnicodePassAndControlsDoNot() throws {
        try Channel.validate("order:42:status")
        try Channel.validate("commande:é:中文")
        try Channel.validate(String(repeating: "x", count: Channel.maxLength))
        try Channel.validate(String(repeating: "é", count: Channel.maxLength))
        for bad in ["a\u{7f}b", "a\nb", "tab\t", "\u{85}next", String(repeating: "x", count: Channel.maxLength + 1),
                    String(repeating: "é", count: Channel.maxLength + 1), ""] {
            #expect(throws: ValidationError.self) { try Channel.validate(bad) }
        }
        let job = try EventIntake.channelEvent(.object(["channel": .string("c"), "alert": .object(["aps": .object([:])])]),
                                               appID: "shop", jobID: nil)
        #expect(job.id.wholeMatch(of: /[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}/) != nil)
    }
}

@Suite struct APNsIDTests {
    @Test("a push's apns-id is a version-8 UUID derived from app, job and token: the same on every delivery, different otherwise")
    func deterministic() {
        let job = PushJob(id: "job-1", appId: "shop", target: .channel("c"))
        let token = String(repeating: "ab", count: 32)
        let id = job.apnsID(token: token).uuidString.lowercased()
        // SHA-256 of "shop\njob-1\n" + token, version and variant bits set: dead letters written by older builds
        // carry ids made this way.
        #expect(id == "ecf6c52e-7ce6-81e2-9ecd-95a820bb2834")
        #expect(id == job.apnsID(token: token.uppercased()).uuidString.lowercased(), "tokens compare lowercased")
        #expect(id.range(of: "^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$",
                         options: .regularExpression) != nil, "\(id)")
        #expect(id != job.apnsID(token: String(repeating: "cd", count: 32)).uuidString.lowercased())
        #expect(id != PushJob(id: "job-2", appId: "shop", target: .channel("c")).apnsID(token: token).uuidString.lowercased())
        #expect(id != PushJob(id: "job-1", appId: "other", target: .channel("c")).apnsID(token: token).uuidString.lowercased())
    }
}

@Suite struct DeadLetterTests {
    @Test func replaysAsADeviceJobMarkedReplayOf() throws {
        let original = try EventIntake.channelEvent(json(#"{"channel": "c", "alert": {"aps": {"alert": "hi"}}, "priority": 5}"#),
                                                    appID: "shop", jobID: "job-1")
        var letter = DeadLetter(appId: "shop", job: original, reason: "ServiceUnavailable", attempts: 5)
        letter.deviceToken = token
        letter.tokenType = .alert
        letter.environment = .sandbox
        letter.topic = "com.example.shop"
        letter.pushType = "alert"
        letter.payload = original.alert
        letter.priority = 5
        letter.status = 503
        #expect(letter.recordKey == "shop/device/\(SHA256.hex(token))")
        let replay = try #require(letter.replayJob(partition: 2, offset: 40, id: "replay-1"))
        try replay.validate()
        #expect(replay.target.kind == .device && replay.target.environment == .sandbox)
        #expect(replay.replayOf == PushJob.ReplayOf(jobId: "job-1", dlqPartition: 2, dlqOffset: 40, channel: "c"),
                "the channel the push first went out for is kept")
        #expect(try PushJob.decode(replay.encoded()) == replay)
        #expect(try DeadLetter.decode(letter.encoded()) == letter)
        try validateAgainstSchema([letter.encoded()], schema: "dead-letter.schema.json")
        try validateAgainstSchema([replay.encoded()], schema: "push-job.schema.json")
        // The replay fails again: its dead letter is a device job's, and still names the channel.
        var again = DeadLetter(appId: "shop", job: replay, reason: "ServiceUnavailable", attempts: 5)
        again.deviceToken = token
        again.payload = original.alert
        #expect(again.originalChannel == "c" && again.originalPost == nil)
        #expect(again.replayJob(partition: 3, offset: 7, id: "replay-2")?.replayOf?.channel == "c")
        try validateAgainstSchema([again.encoded()], schema: "dead-letter.schema.json")
        #expect(DeadLetter(appId: "shop", job: nil, reason: "invalid_job", attempts: 0).replayJob(partition: 0, offset: 0, id: "x") == nil)
    }
}

