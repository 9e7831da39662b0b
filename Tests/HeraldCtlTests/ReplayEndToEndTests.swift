import Foundation
import HeraldCore
import HeraldCrypto
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldStore
import HeraldTestSupport
import Testing

/// The replay loop as an operator runs it: herald-dispatcher and herald-apns-sim as processes dead-letter a channel
/// job's pushes, heraldctl (a process too) lists and replays them, and the dispatcher delivers each one once.
@Suite("heraldctl replay end to end", .serialized)
struct ReplayEndToEndTests {
    @Test("rejected pushes are dead-lettered, listed with APNs' reason, replayed once per token after the fix")
    func rejectedThenReplayed() async throws {
        let directory = try scratchDirectory("herald-replay-e2e-")
        let apps = try TestApps()
        defer { apps.remove() }
        let harness = try await CtlHarness.make(partitions: 1, jobSigningSecretPath: apps.jobSigningSecretPath)
        let app = apps.apps[0]
        let channel = "order:\(SecureRandom.hex(4)):status"
        // Two rejections that leave subscriptions in place (unlike 410 / BadDeviceToken), so replay sends to them.
        let badTopic = (0..<3).map { _ in token(prefix: "badd") }
        let disallowed = (0..<3).map { _ in token(prefix: "d00d") }
        let tokens = badTopic + disallowed
        let store = SubscriptionStore(redis: harness.redis)
        for token in tokens {
            _ = try await store.upsert(app: app.id, SubscriptionInput(.object([
                "channel": .string(channel), "deviceToken": .string(token), "tokenType": .string("alert"),
            ])))
        }

        let simulator = try SimulatorProcess(apps: apps, directory: directory, rules: [
            .object(["tokenPrefix": .string("badd"), "status": .number(400), "reason": .string("BadTopic")]),
            .object(["tokenPrefix": .string("d00d"), "status": .number(400), "reason": .string("TopicDisallowed")]),
        ])
        try await simulator.waitUntilListening()
        let dispatcher = try DispatcherProcess(apps: apps, simulator: simulator, brokers: harness.brokers,
                                               jobsTopic: harness.jobsTopic, deadLetterTopic: harness.dlqTopic,
                                               group: "herald-dispatcher-" + SecureRandom.hex(5), directory: directory)
        try await dispatcher.waitForAssignment()

        var job = PushJob(id: "e2e-" + SecureRandom.hex(4), appId: app.id, target: .channel(channel))
        job.alert = .object(["aps": .object(["alert": .object(["title": .string("Shipped")])]), "order": .number(7)])
        _ = try await harness.producer.send(topic: harness.jobsTopic, key: job.recordKey, value: job.encoded(),
                                            headers: apps.signatureHeaders(job.encoded()))

        // Six dead letters in the shared format, one per device, with APNs' reason.
        let records = try await readRecords(harness.dlqTopic, brokers: harness.brokers, count: tokens.count)
        #expect(records.count == tokens.count, "one dead letter per rejected push, no more")
        try validateAgainstSchema(records.map(\.value), schema: "dead-letter.schema.json")
        let letters = try records.map { try JSONDecoder().decode(JSONValue.self, from: Data($0.value)) }
        for token in tokens {
            let letter = try #require(letters.first { $0["deviceToken"]?.stringValue == token })
            #expect(letter["reason"]?.stringValue == (badTopic.contains(token) ? "BadTopic" : "TopicDisallowed"))
            #expect(letter["status"]?.numberValue == 400)
            #expect(letter["disposition"]?.stringValue == "rejected")
            #expect(letter["apnsId"]?.stringValue == job.apnsID(token: token).uuidString.lowercased())
        }
        #expect(simulator.acceptedCount() == 0)

        let listed = try await harness.heraldctl(["dlq", "list", "--json"])
        #expect(listed.status == 0, "\(listed.stderr)")
        let list = try listed.json()
        #expect(list["matched"]?.numberValue == 6)
        #expect(list["byReason"] == .object(["BadTopic": .number(3), "TopicDisallowed": .number(3)]))
        let rows = list["deadLetters"]?.arrayValue ?? []
        #expect(rows.count == 6)
        for row in rows {
            let masked = row["token"]?.stringValue ?? ""
            #expect(!tokens.contains(masked), "tokens are masked")
            let expected = masked.hasPrefix("badd") ? "BadTopic" : "TopicDisallowed"
            #expect(row["reason"]?.stringValue == expected && row["appId"]?.stringValue == app.id)
            #expect(row["target"]?["channel"]?.stringValue == channel)
        }

        // The fix: APNs accepts these tokens again (the simulator re-reads its rules at most every 100 ms).
        try simulator.setRules([])
        try await Task.sleep(for: .milliseconds(300))

        let dry = try await harness.heraldctl(["replay", "--dry-run", "--json"])
        #expect(dry.status == 0, "\(dry.stdout)\n\(dry.stderr)")
        #expect(try dry.json()["wouldRepublish"]?.numberValue == 6)
        let name = "e2e-" + SecureRandom.hex(4)
        let filtered = try await harness.heraldctl(["replay", "--name", name, "--reason", "BadTopic", "--json"])
        #expect(filtered.status == 0, "\(filtered.stdout)\n\(filtered.stderr)")
        #expect(try filtered.json()["matched"]?.numberValue == 3)
        #expect(try filtered.json()["republished"]?.numberValue == 3)
        try await eventually("the BadTopic half was delivered", timeout: .seconds(30)) { simulator.acceptedCount() >= 3 }
        try await Task.sleep(for: .seconds(1))
        #expect(deliveries(simulator) == Dictionary(uniqueKeysWithValues: badTopic.map { ($0, 1) }),
                "the dry run sent nothing; the filter chose exactly the BadTopic half")

        let all = try await harness.heraldctl(["replay", "--name", name, "--json"])
        #expect(all.status == 0, "\(all.stdout)\n\(all.stderr)")
        let summary = try all.json()
        #expect(summary["republished"]?.numberValue == 3 && summary["alreadyRepublished"]?.numberValue == 3,
                "the same replay without the filter sends only the rest")
        try await eventually("every token was delivered", timeout: .seconds(30)) { simulator.acceptedCount() >= 6 }
        try await Task.sleep(for: .seconds(1))
        #expect(deliveries(simulator) == Dictionary(uniqueKeysWithValues: tokens.map { ($0, 1) }), "each token once")
        let pushes = simulator.accepted()
        #expect(pushes.allSatisfy { $0["topic"]?.stringValue == app.bundleID && $0["payload"]?["order"]?.numberValue == 7 },
                "the replayed push is the original one")

        let again = try await harness.heraldctl(["replay", "--name", name, "--json"])
        #expect(again.status == 0, "\(again.stdout)\n\(again.stderr)")
        #expect(try again.json()["republished"]?.numberValue == 0)
        #expect(try again.json()["alreadyRepublished"]?.numberValue == 6)
        try await Task.sleep(for: .seconds(2))
        #expect(simulator.acceptedCount() == 6, "a second run delivers nothing more")
        let stats = try await harness.heraldctl(["dlq", "stats", "--json"]).json()
        #expect(stats["matched"]?.numberValue == 6, "the replayed pushes did not fail again")

        await dispatcher.child.stop()
        await simulator.child.stop()
        await harness.close()
        try? FileManager.default.removeItem(atPath: directory)
    }

    @Test("a replay against an APNs that still refuses, run three times, sends each dead letter once; its new dead letters keep the channel")
    func replayConvergesWhileAPNsStillFails() async throws {
        let directory = try scratchDirectory("herald-replay-e2e-")
        let apps = try TestApps()
        defer { apps.remove() }
        let harness = try await CtlHarness.make(partitions: 1, jobSigningSecretPath: apps.jobSigningSecretPath)
        let app = apps.apps[0]
        let channel = "order:\(SecureRandom.hex(4)):status"
        let tokens = (0..<4).map { _ in token(prefix: "badd") }
        let store = SubscriptionStore(redis: harness.redis)
        for token in tokens {
            _ = try await store.upsert(app: app.id, SubscriptionInput(.object([
                "channel": .string(channel), "deviceToken": .string(token), "tokenType": .string("alert"),
            ])))
        }
        let simulator = try SimulatorProcess(apps: apps, directory: directory, rules: [
            .object(["tokenPrefix": .string("badd"), "status": .number(400), "reason": .string("BadTopic")]),
        ])
        try await simulator.waitUntilListening()
        let dispatcher = try DispatcherProcess(apps: apps, simulator: simulator, brokers: harness.brokers,
                                               jobsTopic: harness.jobsTopic, deadLetterTopic: harness.dlqTopic,
                                               group: "herald-dispatcher-" + SecureRandom.hex(5), directory: directory)
        try await dispatcher.waitForAssignment()
        var job = PushJob(id: "still-" + SecureRandom.hex(4), appId: app.id, target: .channel(channel))
        job.alert = .object(["aps": .object(["alert": .object(["title": .string("Shipped")])])])
        _ = try await harness.producer.send(topic: harness.jobsTopic, key: job.recordKey, value: job.encoded(),
                                            headers: apps.signatureHeaders(job.encoded()))
        _ = try await readRecords(harness.dlqTopic, brokers: harness.brokers, count: tokens.count)

        let name = "still-" + SecureRandom.hex(4)
        let first = try await harness.heraldctl(["replay", "--name", name, "--json"])
        #expect(first.status == 0, "\(first.stdout)\n\(first.stderr)")
        #expect(try first.json()["republished"]?.numberValue == 4)
        // APNs refuses them again: four more dead letters, of replayed jobs.
        let afterFirst = try await readRecords(harness.dlqTopic, brokers: harness.brokers, count: 2 * tokens.count)
        #expect(afterFirst.count == 2 * tokens.count)
        try validateAgainstSchema(afterFirst.map(\.value), schema: "dead-letter.schema.json")
        for run in 2...3 {
            let rerun = try await harness.heraldctl(["replay", "--name", name, "--json"])
            #expect(rerun.status == 0, "\(rerun.stdout)\n\(rerun.stderr)")
            let summary = try rerun.json()
            #expect(summary["republished"]?.numberValue == 0, "run \(run) sent again")
            #expect(summary["alreadyRepublished"]?.numberValue == 4, "run \(run)")
            #expect(summary["replayedLeftOut"]?.numberValue == 4, "run \(run): the replays' own dead letters, counted apart")
        }
        // Runs 2 and 3 published nothing: the jobs topic holds the job and the first run's replays only.
        let jobs = try await readRecords(harness.jobsTopic, brokers: harness.brokers, count: 1 + tokens.count)
        #expect(jobs.count == 1 + tokens.count, "runs 2 and 3 sent nothing")
        let final = try await readRecords(harness.dlqTopic, brokers: harness.brokers, count: 2 * tokens.count)
        #expect(final.count == 2 * tokens.count, "nothing failed again")
        // The replays' dead letters are found by the channel the pushes first went out for.
        let byChannel = try await harness.heraldctl(["dlq", "list", "--channel", channel, "--json"])
        #expect(try byChannel.json()["matched"]?.numberValue == 8, "\(byChannel.stdout)")
        let included = try await harness.heraldctl(["replay", "--name", name, "--include-replayed", "--dry-run", "--json"])
        #expect(try included.json()["wouldRepublish"]?.numberValue == 4, "\(included.stdout)")

        await dispatcher.child.stop()
        await simulator.child.stop()
        await harness.close()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// A post's broadcast channel at the simulator: APNs' answers to its broadcasts are retried (429, 500) or not
    /// (400), the failures dead-lettered with the channel; replay publishes each once, and skips the letter of a
    /// channel that is gone (ChannelNotRegistered forgets it).
    @Test("failed broadcasts are retried or dead-lettered with their channel, and a replay publishes each once")
    func failedBroadcastsReplayedOnce() async throws {
        let directory = try scratchDirectory("herald-replay-broadcast-")
        let apps = try TestApps()
        defer { apps.remove() }
        let harness = try await CtlHarness.make(partitions: 1, jobSigningSecretPath: apps.jobSigningSecretPath)
        let app = apps.apps[0]
        let simulator = try SimulatorProcess(apps: apps, directory: directory)
        try await simulator.waitUntilListening()
        let dispatcher = try DispatcherProcess(apps: apps, simulator: simulator, brokers: harness.brokers,
                                               jobsTopic: harness.jobsTopic, deadLetterTopic: harness.dlqTopic,
                                               group: "herald-dispatcher-" + SecureRandom.hex(5), directory: directory)
        try await dispatcher.waitForAssignment()
        let post = SecureRandom.hex(8)
        func send(_ job: PushJob) async throws {
            _ = try await harness.producer.send(topic: harness.jobsTopic, key: job.recordKey, value: job.encoded(),
                                                headers: apps.signatureHeaders(job.encoded()))
        }
        var create = PushJob(id: "make-" + SecureRandom.hex(4), appId: app.id, target: .post(post))
        create.broadcastChannel = PushJob.BroadcastChannel(environment: .production, storagePolicy: .noStorage)
        try await send(create)
        let channels = BroadcastChannelStore(redis: harness.redis)
        try await eventually("the channel made", timeout: .seconds(30)) {
            (try? await channels.channels(app: app.id, postIDHash: post))?.isEmpty == false
        }
        let channelID = try #require(try await channels.channels(app: app.id, postIDHash: post).first?.channelID)
        func update(_ step: String) async throws {
            var job = PushJob(id: "upd-\(step)-" + SecureRandom.hex(4), appId: app.id, target: .post(post))
            job.liveActivity = PushJob.LiveActivity(event: .update, contentState: .object(["step": .string(step)]))
            try await send(job)
        }
        @Sendable func published(_ step: String) -> Int {
            simulator.broadcasts().filter { $0["payload"]?["aps"]?["content-state"]?["step"]?.stringValue == step }.count
        }
        let rule = { (status: Int, reason: String, times: Int) -> JSONValue in
            .object(["channelId": .string(channelID), "status": .number(Double(status)), "reason": .string(reason),
                     "times": .number(Double(times))])
        }

        // 429 three times: retried, then published; nothing dead-lettered.
        try simulator.setRules([rule(429, "TooManyRequests", 3)])
        try await Task.sleep(for: .milliseconds(300))
        try await update("retried")
        try await eventually("the retried update published", timeout: .seconds(30)) { published("retried") == 1 }
        // 500 on every attempt, then a 400 that no retry fixes: two dead letters.
        try simulator.setRules([rule(500, "InternalServerError", 5), rule(400, "BadRequestPayload", 1)])
        try await Task.sleep(for: .milliseconds(300))
        try await update("exhausted")
        try await update("rejected")
        let records = try await readRecords(harness.dlqTopic, brokers: harness.brokers, count: 2)
        try #require(records.count == 2, "two failed broadcasts, no more")
        try validateAgainstSchema(records.map(\.value), schema: "dead-letter.schema.json")
        // Jobs of one post may run side by side: the letters' order is not the updates'.
        let letters = try records.map { try DeadLetter.decode($0.value) }.sorted { $0.attempts > $1.attempts }
        #expect(letters.map(\.disposition) == [.retriesExhausted, .rejected])
        #expect(letters.map(\.attempts) == [5, 1])
        #expect(letters.map(\.reason) == ["InternalServerError", "BadRequestPayload"])
        #expect(letters.allSatisfy { $0.channelId == channelID && $0.storagePolicy == .noStorage && $0.deviceToken == nil })
        #expect(published("exhausted") == 0 && published("rejected") == 0)

        // The fix: both are replayed, each once, to the same channel with the same payload.
        try simulator.setRules([])
        try await Task.sleep(for: .milliseconds(300))
        let name = "bcast-" + SecureRandom.hex(4)
        let replay = try await harness.heraldctl(["replay", "--name", name, "--json"])
        #expect(replay.status == 0, "\(replay.stdout)\n\(replay.stderr)")
        #expect(try replay.json()["republished"]?.numberValue == 2)
        try await eventually("both replayed", timeout: .seconds(30)) { published("exhausted") == 1 && published("rejected") == 1 }
        let again = try await harness.heraldctl(["replay", "--name", name, "--json"])
        #expect(try again.json()["republished"]?.numberValue == 0 && again.json()["alreadyRepublished"]?.numberValue == 2)
        try await Task.sleep(for: .seconds(2))
        #expect(published("exhausted") == 1 && published("rejected") == 1, "a second run publishes nothing more")
        #expect(simulator.broadcasts().allSatisfy { $0["channelId"]?.stringValue == channelID && $0["expiration"]?.numberValue == 0 })

        // APNs no longer knows the channel: dead-lettered, forgotten, and its replay skipped as removed.
        try simulator.setRules([rule(400, "ChannelNotRegistered", 1)])
        try await Task.sleep(for: .milliseconds(300))
        try await update("unknown")
        _ = try await readRecords(harness.dlqTopic, brokers: harness.brokers, count: 3)
        try await eventually("the channel forgotten", timeout: .seconds(10)) {
            (try? await channels.channels(app: app.id, postIDHash: post))?.isEmpty == true
        }
        let skipped = try await harness.heraldctl(["replay", "--name", name, "--json"])
        #expect(skipped.status == 3, "\(skipped.stdout)\n\(skipped.stderr)")
        #expect(try skipped.json()["skipped"]?["channel_removed"]?.numberValue == 1, "\(skipped.stdout)")

        await dispatcher.child.stop()
        await simulator.child.stop()
        await harness.close()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Deliveries per token in the simulator's record file.
    private func deliveries(_ simulator: SimulatorProcess) -> [String: Int] {
        simulator.accepted().compactMap { $0["token"]?.stringValue }.reduce(into: [:]) { $0[$1, default: 0] += 1 }
    }

    /// A fresh 64-hex-digit token starting with `prefix` (the simulator's rules match on it).
    private func token(prefix: String) -> String { prefix + SecureRandom.hex(32).dropFirst(prefix.count) }

    /// Reads `topic` from the beginning outside any group until `count` records arrived, then a second longer so
    /// that any extra record shows up too.
    private func readRecords(_ topic: String, brokers: String, count: Int) async throws -> [KafkaRecord] {
        let consumer = try KafkaConsumer(configuration: KafkaConsumerConfiguration(
            kafka: KafkaConfiguration(brokerList: brokers), groupID: nil), logger: CtlHarness.logger)
        let partitions = try await consumer.partitionCount(topic: topic)
        try await consumer.assign((0..<partitions).map {
            KafkaTopicPartitionOffset(topic: topic, partition: Int32($0), offset: KafkaTopicPartitionOffset.beginning)
        })
        var records: [KafkaRecord] = []
        let clock = ContinuousClock()
        let end = clock.now + .seconds(30)
        while records.count < count, clock.now < end {
            records += try await consumer.poll(maxRecords: 1000, timeout: .milliseconds(200))
        }
        let settle = clock.now + .seconds(1)
        while clock.now < settle { records += try await consumer.poll(maxRecords: 1000, timeout: .milliseconds(200)) }
        try await consumer.close()
        return records
    }
}
