import Foundation
import HeraldCore
import HeraldCrypto
import HeraldKafka
import HeraldRuntime
import HeraldStore
import HeraldTestSupport
import Testing

/// The producer endpoints against real Redis and Tansu: what lands on the jobs topic (count, key, schema), the
/// idempotency window, validation, and a broker that dies and comes back.
@Suite struct EventsAPITests {
    // MARK: - One record per event, with its key, valid against the published schema

    @Test func channelEventPublishesOneValidRecordKeyedByChannel() async throws {
        let ingest = try await IngestHarness.start(rateLimit: 10_000)
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let channel = "order:\(SecureRandom.hex(4)):status"
        let response = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey, json: """
            {"channel": "\(channel)",
             "alert": {"aps": {"alert": {"title": "Shipped", "body": "Order #42"}, "sound": "default"}, "orderId": 42},
             "liveActivity": {"event": "update", "contentState": {"status": "shipped", "eta": 1700000000},
                              "staleDate": 1900000000, "relevanceScore": 0.5, "alert": {"title": "Shipped"}},
             "start": {"attributesType": "OrderAttributes", "attributes": {"orderId": 42},
                       "contentState": {"status": "shipped"}, "alert": {"title": "Your order is on its way"}},
             "priority": 5, "expiration": 1900000000, "collapseId": "order-42"}
            """)
        #expect(response.status == 202, "\(response.text)")
        let jobID = try #require(try response.json()["jobId"] as? String)
        // Without a client id the job id is a random (version 4) UUID.
        #expect(jobID.wholeMatch(of: /[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}/) != nil, "\(jobID)")

        let records = try await JobsReader.recordsBeforeMarker(ingest, app: app, channel: channel)
        try #require(records.count == 1, "expected one record, got \(records.count)")
        let record = records[0]
        #expect(record.keyText == "\(app.id)/\(channel)")
        try await validateJobs([record.value])
        let job = try PushJob.decode(record.value)
        try job.validate()
        #expect(job.id == jobID && job.appId == app.id && job.version == 1)
        #expect(job.target == .channel(channel))
        #expect(job.alert?["orderId"] == .number(42))
        #expect(job.liveActivity?.event == .update && job.liveActivity?.staleDate == 1_900_000_000)
        #expect(job.liveActivity?.relevanceScore == 0.5)
        #expect(job.start?.attributesType == "OrderAttributes" && job.start?.attributes["orderId"] == .number(42))
        #expect(job.priority == 5 && job.expiration == 1_900_000_000 && job.collapseId == "order-42")
        let created = try #require(Timestamp.parse(job.createdAt))
        #expect(abs(created.timeIntervalSinceNow) < 60)
    }

    @Test func activityEventPublishesOneValidRecordKeyedByPost() async throws {
        let ingest = try await IngestHarness.start(rateLimit: 10_000)
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let post = SecureRandom.hex(8)
        let update = try await ingest.request("POST", "/v1/apps/\(app.id)/activities/\(post)/events", key: app.secretKey,
                                              json: #"{"event": "update", "contentState": {"score": "1-0"}, "final": true, "dismissalDate": 1900000000}"#)
        #expect(update.status == 202, "\(update.text)")
        let end = try await ingest.request("POST", "/v1/apps/\(app.id)/activities/\(post)/events", key: app.secretKey,
                                           json: #"{"event": "end", "contentState": {"score": "2-1"}}"#)
        #expect(end.status == 202, "\(end.text)")

        let records = try await JobsReader.recordsBeforeMarker(ingest, app: app, awaiting: (2, "\(app.id)/post/\(post)"))
        try #require(records.count == 2, "expected two records, got \(records.count)")
        #expect(records.allSatisfy { $0.keyText == "\(app.id)/post/\(post)" })
        #expect(records.allSatisfy { JobSignature.verifies($0.headers, record: $0.value, secrets: [ingest.apps.deploymentSecret]) },
                "every job carries the deployment's signature")
        try await validateJobs(records.map(\.value))
        // Same key, same partition: the broker keeps them in the order they were accepted.
        let jobs = try records.map { try PushJob.decode($0.value) }
        #expect(jobs.map(\.id) == [try update.json()["jobId"] as? String, try end.json()["jobId"] as? String])
        #expect(jobs[0].target == .post(post) && jobs[0].final == true && jobs[0].liveActivity?.dismissalDate == 1_900_000_000)
        #expect(jobs[1].liveActivity?.event == .end && jobs[1].isFinal)
    }

    @Test func devicePushPublishesOneValidRecordKeyedByLowercaseToken() async throws {
        let ingest = try await IngestHarness.start(rateLimit: 10_000)
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let token = deviceToken()
        let response = try await ingest.request("POST", "/v1/apps/\(app.id)/devices/\(token.uppercased())/push",
                                                key: app.secretKey, json: """
            {"payload": {"aps": {"content-available": 1}, "sync": "inbox"}, "pushType": "background", "priority": 5,
             "environment": "sandbox", "tokenType": "alert", "collapseId": "\(String(repeating: "s", count: 64))"}
            """)
        #expect(response.status == 202, "\(response.text)")

        let records = try await JobsReader.recordsBeforeMarker(ingest, app: app,
                                                               awaiting: (1, "\(app.id)/device/\(SHA256.hex(token))"))
        try #require(records.count == 1, "expected one record, got \(records.count)")
        #expect(records[0].keyText == "\(app.id)/device/\(SHA256.hex(token))", "a key names the device by a hash of its token")
        try await validateJobs([records[0].value])
        let job = try PushJob.decode(records[0].value)
        #expect(job.id == (try response.json()["jobId"] as? String))
        #expect(job.target == .device(token, tokenType: .alert, environment: .sandbox))
        #expect(job.pushType == "background" && job.priority == 5 && job.payload?["sync"] == .string("inbox"))
    }

    @Test func publishingIsCountedInTheMetrics() async throws {
        let ingest = try await IngestHarness.start(rateLimit: 10_000)
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let response = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey,
                                                json: #"{"channel": "metrics", "alert": {"aps": {"alert": "hi"}}}"#)
        #expect(response.status == 202, "\(response.text)")
        let metrics = try await ingest.request("GET", "/metrics").text
        let published = metrics.split(separator: "\n").first { $0.hasPrefix(#"herald_ingest_jobs_published_total{target="channel"}"#) }
        #expect((published?.split(separator: " ").last).flatMap { Double($0) } ?? 0 >= 1, "\(metrics)")
        #expect(metrics.contains("herald_ingest_publish_seconds_count"))
    }

    // MARK: - Idempotency

    @Test func clientIDPublishesOnceAndReturnsTheSameJobID() async throws {
        let ingest = try await IngestHarness.start(rateLimit: 10_000)
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let channel = "idem-\(SecureRandom.hex(4))"
        let bodyID = "evt-\(SecureRandom.hex(6))", headerID = "idem-\(SecureRandom.hex(6))"
        let event = #"{"channel": "\#(channel)", "alert": {"aps": {"alert": "hi"}}"#

        var jobIDs: [String] = []
        for _ in 0..<3 {
            let response = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey,
                                                    json: event + #", "id": "\#(bodyID)"}"#)
            #expect(response.status == 202, "\(response.text)")
            jobIDs.append(try response.json()["jobId"] as? String ?? "")
        }
        for _ in 0..<2 {
            let response = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey,
                                                    json: event + "}", headers: ["Idempotency-Key": headerID])
            #expect(response.status == 202, "\(response.text)")
            jobIDs.append(try response.json()["jobId"] as? String ?? "")
        }
        // Ids are per app, not per endpoint: reusing one on a device push answers the first job, publishes nothing.
        let token = deviceToken()
        let push = try await ingest.request("POST", "/v1/apps/\(app.id)/devices/\(token)/push", key: app.secretKey,
                                            json: #"{"payload": {"aps": {"alert": "x"}}}"#,
                                            headers: ["Idempotency-Key": headerID])
        #expect(push.status == 202, "\(push.text)")
        #expect(jobIDs == [bodyID, bodyID, bodyID, headerID, headerID])
        #expect(try push.json()["jobId"] as? String == headerID)

        let records = try await JobsReader.recordsBeforeMarker(ingest, app: app, channel: channel)
        let ids = try records.map { try PushJob.decode($0.value).id }
        #expect(ids.sorted() == [bodyID, headerID].sorted(), "one record per id, got \(ids)")
        // Another app may use the same id: the window is per app.
        let other = ingest.apps.apps[1]
        let response = try await ingest.request("POST", "/v1/apps/\(other.id)/events", key: other.secretKey,
                                                json: event + #", "id": "\#(bodyID)"}"#)
        #expect(response.status == 202, "\(response.text)")
        let otherRecords = try await JobsReader.recordsBeforeMarker(ingest, app: other, channel: channel)
        let otherJobs = try otherRecords.map { try PushJob.decode($0.value) }.filter { $0.appId == other.id }
        #expect(otherJobs.map(\.id) == [bodyID])
    }

    @Test func idempotencyClaimLivesInRedisForTheWindow() async throws {
        let ingest = try await IngestHarness.start(rateLimit: 10_000)
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let id = "evt-\(SecureRandom.hex(6))"
        let response = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey,
                                                json: #"{"channel": "c", "alert": {"aps": {}}, "id": "\#(id)"}"#)
        #expect(response.status == 202, "\(response.text)")
        let key = RedisKeys(app: app.id).idempotency(id)
        #expect(try await ingest.redis.command(["GET", key]).string == "published")
        let ttl = try await ingest.redis.command(["TTL", key]).int ?? -1
        #expect((86_000...86_400).contains(ttl), "TTL \(ttl)")
    }

    // MARK: - Validation: 4xx and nothing published

    static let tooBig = String(repeating: "x", count: 4100)
    /// Fits on its own (4 000 bytes of content state) but not once Herald adds aps.timestamp, event, content-state.
    static let bigAfterAPS = String(repeating: "y", count: 4060)

    /// (path after /v1/apps/{appID}/, body, status, error field); TOKEN becomes a fresh device token.
    static let invalidEvents: [(String, String, Int, String?)] = [
        ("events", #"{"alert": {"aps": {}}}"#, 400, "channel"),
        ("events", #"{"channel": "", "alert": {"aps": {}}}"#, 400, "channel"),
        ("events", #"{"channel": "c\u0007", "alert": {"aps": {}}}"#, 400, "channel"),
        ("events", #"{"channel": "c"}"#, 400, "alert"),
        ("events", #"{"channel": "c", "alert": {"title": "no aps"}}"#, 400, "alert"),
        ("events", #"{"channel": "c", "alert": {"aps": {}}, "priority": 7}"#, 400, "priority"),
        ("events", #"{"channel": "c", "alert": {"aps": {}}, "priority": "high"}"#, 400, "priority"),
        ("events", #"{"channel": "c", "alert": {"aps": {}}, "expiration": -1}"#, 400, "expiration"),
        ("events", #"{"channel": "c", "alert": {"aps": {}}, "collapseId": "\#(String(repeating: "é", count: 33))"}"#, 400, "collapseId"),
        ("events", #"{"channel": "c", "alert": {"aps": {}}, "collapseId": "\#(String(repeating: "x", count: 65))"}"#, 400, "collapseId"),
        ("events", #"{"channel": "c", "alert": {"aps": {}}, "colapseId": "typo"}"#, 400, "colapseId"),
        // 256 Unicode scalars (as JSON Schema counts), though only 128 characters as Swift counts graphemes.
        ("events", #"{"channel": "\#(String(repeating: "e\u{301}", count: 128))", "alert": {"aps": {}}}"#, 400, "channel"),
        ("events", #"{"channel": "c", "liveActivity": {"event": "start", "contentState": {}}}"#, 400, "liveActivity.event"),
        ("events", #"{"channel": "c", "liveActivity": {"contentState": {}}}"#, 400, "liveActivity.event"),
        ("events", #"{"channel": "c", "liveActivity": {"event": "update"}}"#, 400, "liveActivity.contentState"),
        ("events", #"{"channel": "c", "start": {"attributes": {}, "contentState": {}, "alert": {}}}"#, 400, "start.attributesType"),
        ("events", #"{"channel": "c", "start": {"attributesType": "T", "contentState": {}, "alert": {}}}"#, 400, "start.attributes"),
        ("events", #"{"channel": "c", "start": {"attributesType": "T", "attributes": {}, "alert": {}}}"#, 400, "start.contentState"),
        ("events", #"{"channel": "c", "start": {"attributesType": "T", "attributes": {}, "contentState": {}}}"#, 400, "start.alert"),
        ("events", #"{"channel": "c", "alert": {"aps": {"alert": "\#(tooBig)"}}}"#, 400, "alert"),
        ("events", #"{"channel": "c", "liveActivity": {"event": "update", "contentState": {"s": "\#(bigAfterAPS)"}}}"#, 400, "liveActivity"),
        ("events", #"{"channel": "c", "alert": {"aps": {}}, "id": "has space"}"#, 400, "id"),
        ("events", #"["not", "an", "object"]"#, 400, nil),
        ("events", #"{"channel": "c", "alert": "#, 400, nil),
        ("activities/deadbeef/events", #"{"event": "pause", "contentState": {}}"#, 400, "event"),
        ("activities/deadbeef/events", #"{"event": "update", "contentState": {}, "final": "yes"}"#, 400, "final"),
        ("activities/deadbeef/events", #"{"event": "update", "contentState": {}, "alert": {}, "start": {}}"#, 400, "start"),
        ("activities/NOT-HEX/events", #"{"event": "update", "contentState": {}}"#, 400, "postIdHash"),
        ("devices/abc/push", #"{"payload": {"aps": {}}}"#, 400, "deviceToken"),
        ("devices/TOKEN/push", #"{"pushType": "alert"}"#, 400, "payload"),
        ("devices/TOKEN/push", #"{"payload": {"aps": {}}, "pushType": "background", "priority": 10}"#, 400, "priority"),
        ("events", #"{"channel": "c", "alert": {"aps": {}}, "liveActivity": {"event": "update", "contentState": {}}, "priority": 1}"#, 400, "priority"),
        ("activities/deadbeef/events", #"{"event": "update", "contentState": {}, "priority": 1}"#, 400, "priority"),
        ("devices/TOKEN/push", #"{"payload": {"aps": {}}, "tokenType": "liveactivity-update", "priority": 1}"#, 400, "priority"),
        ("devices/TOKEN/push", #"{"payload": {"aps": {}}, "tokenType": "widget"}"#, 400, "tokenType"),
        ("devices/TOKEN/push", #"{"payload": {"aps": {"alert": "\#(tooBig)"}}}"#, 400, "payload"),
    ]

    @Test func invalidEventsAreRefusedAndPublishNothing() async throws {
        let ingest = try await IngestHarness.start(rateLimit: 10_000)
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        for (path, body, status, field) in Self.invalidEvents {
            let resolved = path.replacingOccurrences(of: "TOKEN", with: deviceToken())
            let response = try await ingest.request("POST", "/v1/apps/\(app.id)/\(resolved)", key: app.secretKey, json: body)
            #expect(response.status == status, "\(path) \(body.prefix(120)): \(response.text)")
            #expect(response.errorCode != nil, "\(response.text)")
            if let field { #expect(response.errorField == field, "\(path) \(body.prefix(120)): \(response.text)") }
        }
        // The marker shares the key a published "c" event would have had, so it would sit behind it.
        let records = try await JobsReader.recordsBeforeMarker(ingest, app: app, channel: "c")
        #expect(records.isEmpty, "published \(records.map(\.keyText))")
    }

    @Test func refusedCallersPublishNothing() async throws {
        let ingest = try await IngestHarness.start(rateLimit: 10_000)
        defer { Task { await ingest.stop() } }
        let (app, other) = (ingest.apps.apps[0], ingest.apps.apps[1])
        let event = #"{"channel": "c", "alert": {"aps": {}}}"#
        let cases: [(String?, [String: String], String?, Int)] = [
            (app.publicKey, [:], event, 403),            // producer endpoints take a secret key only
            (other.secretKey, [:], event, 403),          // another app's key
            (nil, [:], event, 401),
            ("hrd_sec_unknown", [:], event, 401),
            (app.secretKey, ["Content-Type": "text/plain"], event, 415),
        ]
        for (key, headers, body, status) in cases {
            let response = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: key, json: body, headers: headers)
            #expect(response.status == status, "\(response.text)")
        }
        let records = try await JobsReader.recordsBeforeMarker(ingest, app: app, channel: "c")
        #expect(records.isEmpty, "published \(records.map(\.keyText))")
    }

    // MARK: - Broker down and back

    /// A broker of this test's own: killed (SIGKILL, as a crash), then a fresh one on the same port, which (memory
    /// storage) has lost every topic and producer id. Ingest is never restarted.
    @Test func brokerDownAnswers503InTimeAndPublishingResumesWithoutRestart() async throws {
        let bound = Duration.seconds(2)
        let directory = try scratchDirectory("herald-events-broker-")
        let broker = try await TansuBroker.started(directory: directory)
        defer { Task { await broker.crash() } }
        let ingest = try await IngestHarness.start(rateLimit: 10_000, publishTimeout: bound, brokers: broker.address)
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        try await broker.createTopic(ingest.topic)
        let event = #"{"channel": "outage", "alert": {"aps": {"alert": "hi"}}"#

        let before = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey, json: event + "}")
        #expect(before.status == 202, "\(before.text)")

        await broker.crash()
        let clock = ContinuousClock()
        for attempt in 0..<2 {
            let started = clock.now
            let down = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey,
                                                json: event + #", "id": "outage-\#(attempt)"}"#)
            let took = clock.now - started
            #expect(down.status == 503, "\(down.text)")
            #expect(down.errorCode == "unavailable")
            #expect(took < bound + .milliseconds(1500), "answered after \(took)")
        }
        let notReady = try await ingest.request("GET", "/readyz")
        #expect(notReady.status == 503)
        #expect((try notReady.json()["checks"] as? [String: String])?["kafka"] == "unreachable", "\(notReady.text)")

        try await broker.start()
        try await broker.createTopic(ingest.topic)
        // librdkafka reconnects with a backoff; every attempt meanwhile must still answer within the bound.
        let deadline = clock.now + .seconds(40)
        var resumed: RawHTTPClient.Response?
        while clock.now < deadline {
            let started = clock.now
            let response = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey,
                                                    json: event + #", "id": "outage-0"}"#)
            #expect(clock.now - started < bound + .milliseconds(1500))
            if response.status == 202 { resumed = response; break }
            #expect(response.status == 503, "\(response.text)")
            try await Task.sleep(for: .milliseconds(250))
        }
        let accepted = try #require(resumed, "publishing did not resume after the broker came back")
        // The failed attempt released its id: the retry published it now, under the same job id.
        #expect(try accepted.json()["jobId"] as? String == "outage-0")
        let again = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey, json: event + "}")
        #expect(again.status == 202, "\(again.text)")
        // Readiness is worked out once a second: the next round after the broker answers says ready.
        try await eventually("ingest says ready again", timeout: .seconds(5)) {
            try await ingest.request("GET", "/readyz").status == 200
        }

        // The new broker holds exactly what was acknowledged since it started, valid and keyed.
        let reader = try await JobsReader(brokers: broker.address, topic: ingest.topic)
        let records = try await reader.read { $0.count >= 2 }
        await reader.close()
        try #require(records.count == 2, "got \(records.count) records")
        #expect(records.allSatisfy { $0.keyText == "\(app.id)/outage" })
        try await validateJobs(records.map(\.value))
        #expect(try records.map { try PushJob.decode($0.value).id }.first == "outage-0")
    }

    // MARK: - Jobs from other languages

    /// The README's Python example (examples/produce_job.py) writes a job the schema and the dispatcher's
    /// decoder both accept.
    @Test func pythonExampleProducesAValidJob() async throws {
        let brokers = try TestEnvironment.kafkaBrokers()
        let topic = "herald.jobs.test-python-" + SecureRandom.hex(6)
        let admin = try KafkaAdmin(configuration: KafkaConfiguration(brokerList: brokers), logger: IngestHarness.logger)
        try await admin.createTopic(topic, partitions: 2)
        admin.close()
        let python = heraldDependencies.appendingPathComponent("venv/bin/python").path
        let script = TestEnvironment.repositoryRoot.appendingPathComponent("examples/produce_job.py").path
        let secretFile = NSTemporaryDirectory() + "herald-example-\(SecureRandom.hex(4)).secret"
        let secret = SharedSecret.generateText()
        try "\(secret)\n".write(toFile: secretFile, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: secretFile) }
        let output = try await onThread {
            try runTool(python, [script, "--brokers", brokers, "--topic", topic, "--app", "shop",
                                 "--channel", "order:42:status", "--secret-file", secretFile])
        }
        let printed = try #require(try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])

        let reader = try await JobsReader(brokers: brokers, topic: topic)
        let records = try await reader.read { !$0.isEmpty }
        await reader.close()
        try #require(records.count == 1)
        #expect(records[0].keyText == "shop/order:42:status")
        #expect(JobSignature.verifies(records[0].headers, record: records[0].value,
                                      secrets: [try SharedSecret(bytes: Array(secret.utf8))]))
        try await validateJobs([records[0].value])
        let job = try PushJob.decode(records[0].value)
        try job.validate()
        #expect(job.id == printed["id"] as? String && job.target == .channel("order:42:status"))
    }

    /// What the schema refuses, the dispatcher's decoder refuses too (a typo in a field name is not ignored).
    @Test func schemaAndDecoderAgreeOnUnknownFields() async throws {
        let job = PushJob(id: "j1", appId: "shop", target: .channel("c"))
        var valid = try #require(try JSONSerialization.jsonObject(with: Data(job.encoded())) as? [String: Any])
        valid["alert"] = ["aps": [:]]
        for (path, value) in [(["colapseId"], "x" as Any), (["target", "chanel"], "x"), (["liveActivity", "contentstate"], [:])] {
            var broken = valid
            if path.count == 1 {
                broken[path[0]] = value
            } else {
                var inner = broken[path[0]] as? [String: Any] ?? ["event": "update", "contentState": [:]]
                inner[path[1]] = value
                broken[path[0]] = inner
            }
            let bytes = Array(try JSONSerialization.data(withJSONObject: broken))
            await #expect(throws: (any Error).self, "\(path)") { try await validateJobs([bytes]) }
            #expect(throws: ValidationError.self, "\(path)") { try PushJob.decode(bytes) }
        }
        let bytes = Array(try JSONSerialization.data(withJSONObject: valid))
        try await validateJobs([bytes])
        #expect(try PushJob.decode(bytes).alert == .object(["aps": .object([:])]))
    }
}

/// Validates record values against schemas/push-job.schema.json off Swift's cooperative pool: the validator runs
/// Python and blocks while it does, which would hold up the service's handlers and timers in the same process.
func validateJobs(_ values: [[UInt8]]) async throws {
    try await onThread { try validateAgainstSchema(values, schema: "push-job.schema.json") }
}

// MARK: - Reading the jobs topic

/// Reads every partition of a jobs topic from the beginning, outside any consumer group (nothing to join or
/// leave, so no wait for a rebalance and nothing left behind).
final class JobsReader: Sendable {
    let consumer: KafkaConsumer

    init(brokers: String, topic: String) async throws {
        let kafka = KafkaConfiguration(brokerList: brokers)
        consumer = try KafkaConsumer(configuration: KafkaConsumerConfiguration(kafka: kafka, groupID: nil),
                                     logger: IngestHarness.logger)
        let partitions = try await consumer.partitionCount(topic: topic)
        try await consumer.assign((0..<partitions).map {
            KafkaTopicPartitionOffset(topic: topic, partition: Int32($0), offset: KafkaTopicPartitionOffset.beginning)
        })
    }

    /// Polls until `done` says enough arrived (then a short quiet poll for stragglers) or `deadline` passes.
    func read(deadline: Duration = .seconds(20), done: ([KafkaRecord]) throws -> Bool) async throws -> [KafkaRecord] {
        let clock = ContinuousClock()
        let end = clock.now + deadline
        var records: [KafkaRecord] = []
        while try !done(records), clock.now < end {
            records += try await consumer.poll(maxRecords: 1000, timeout: .milliseconds(200))
        }
        records += try await consumer.poll(maxRecords: 1000, timeout: .milliseconds(300))
        return records
    }

    func close() async { try? await consumer.close() }

    /// Everything on the harness's topic before a marker event published now.
    ///
    /// Every earlier request was answered, so anything it published was acknowledged before the marker was
    /// sent. The marker goes to `channel`'s partition, behind any record of that channel, and a quiet poll after
    /// the marker collects the rest. Records keyed otherwise may sit on another partition whose fetch comes later:
    /// give `awaiting` their count (`keyed` names their key) and the read also waits until that many arrived.
    static func recordsBeforeMarker(_ ingest: IngestHarness, app: TestApps.Entry, channel: String = "marker",
                                    awaiting: (count: Int, keyed: String)? = nil) async throws -> [KafkaRecord] {
        let marker = "marker-\(SecureRandom.hex(6))"
        let response = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey,
                                                json: #"{"channel": "\#(channel)", "alert": {"aps": {}}, "id": "\#(marker)"}"#)
        try #require(response.status == 202, "marker not published: \(response.text)")
        let reader = try await JobsReader(brokers: ingest.brokers, topic: ingest.topic)
        let records = try await reader.read { records in
            try records.contains { try PushJob.decode($0.value).id == marker }
                && records.filter { $0.keyText == awaiting?.keyed }.count >= awaiting?.count ?? 0
        }
        await reader.close()
        let markerIndex = try #require(try records.firstIndex { try PushJob.decode($0.value).id == marker }, "marker never arrived")
        var before = records
        before.remove(at: markerIndex)
        return before
    }
}

extension KafkaRecord {
    var keyText: String? { key.map { String(decoding: $0, as: UTF8.self) } }
}

// MARK: - A broker of the test's own

extension TansuBroker {
    func createTopic(_ topic: String) async throws {
        let admin = try KafkaAdmin(configuration: KafkaConfiguration(brokerList: address), logger: IngestHarness.logger)
        defer { admin.close() }
        try await admin.createTopic(topic, partitions: 2)
    }
}
