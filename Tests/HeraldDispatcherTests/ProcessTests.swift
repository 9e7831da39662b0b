import Foundation
import HeraldCore
import HeraldCrypto
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldStore
import HeraldTestSupport
import Testing

/// Both services as processes (herald-ingest, herald-dispatcher, herald-apns-sim) against real Redis and Tansu.
@Suite("Dispatcher processes", .serialized)
struct ProcessTests {
    @Test("an order-status event posted to herald-ingest reaches each subscriber; SIGTERM stops the dispatcher cleanly")
    func endToEnd() async throws {
        let directory = try scratchDirectory()
        let apps = try TestApps()
        let topics = try await TestTopics.make()
        let simulator = try SimulatorProcess(apps: apps, directory: directory)
        try await simulator.waitUntilListening()
        let ingest = try IngestProcess(apps: apps, topics: topics, directory: directory)
        let dispatcher = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, directory: directory)
        try await ingest.waitUntilReady()
        try await dispatcher.waitForAssignment()

        let app = apps.apps[0]
        let channel = "order:\(SecureRandom.hex(4)):status"
        let phone = deviceToken(), activity = deviceToken()
        for body in [#"{"channel": "\#(channel)", "deviceToken": "\#(phone)", "tokenType": "alert"}"#,
                     #"{"channel": "\#(channel)", "deviceToken": "\#(activity)", "tokenType": "liveactivity-update", "activityID": "A-1"}"#] {
            let created = try await ingest.request("POST", "/v1/apps/\(app.id)/subscriptions", key: app.publicKey, json: body)
            #expect(created.status == 201, "\(created.text)")
        }
        let event = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey, json: """
            {"channel": "\(channel)", "alert": {"aps": {"alert": {"title": "Shipped"}}, "order": 7},
             "liveActivity": {"event": "update", "contentState": {"status": "shipped"}}}
            """)
        #expect(event.status == 202, "\(event.text)")
        try await eventually("both pushes arrived") { simulator.acceptedCount() >= 2 }
        let accepted = simulator.accepted()
        let alert = try #require(accepted.first { $0["token"]?.stringValue == phone })
        #expect(alert["topic"]?.stringValue == app.bundleID)
        #expect(alert["pushType"]?.stringValue == "alert")
        #expect(alert[path: "payload", "order"]?.numberValue == 7)
        let update = try #require(accepted.first { $0["token"]?.stringValue == activity })
        #expect(update["topic"]?.stringValue == app.bundleID + ".push-type.liveactivity")
        #expect(update["pushType"]?.stringValue == "liveactivity")
        #expect(update[path: "payload", "aps", "content-state", "status"]?.stringValue == "shipped")
        #expect(update[path: "payload", "aps", "timestamp"]?.numberValue != nil)

        #expect(try await dispatcher.get("/healthz").status == 200)
        // Readiness is worked out once a second: the round after the assignment says ready.
        try await eventually("the dispatcher says ready", timeout: .seconds(5)) {
            try await dispatcher.get("/readyz").status == 200
        }
        let metrics = try await dispatcher.get("/metrics").text
        for name in ["herald_dispatcher_jobs_consumed_total", "herald_dispatcher_pushes_total",
                     "herald_dispatcher_end_to_end_seconds_bucket", "herald_dispatcher_push_duration_seconds_bucket",
                     "herald_dispatcher_in_flight_pushes", "herald_apns_connections"] {
            #expect(metrics.contains(name), "\(name) missing from /metrics")
        }
        #expect(metricValue(metrics, "herald_dispatcher_pushes_total", labels: ["status": "200"]) == 2)
        // It holds APNs signing keys: no core dump may write them out.
        #expect(coreFileLimit(pid: dispatcher.child.pid).map { [$0.soft, $0.hard] } == ["0", "0"])

        let stopping = ContinuousClock.now
        dispatcher.child.signal(SIGTERM)
        let status = await dispatcher.child.waitForExit(timeout: .seconds(30))
        #expect(status == 0, "dispatcher exit status \(String(describing: status)); log:\n\(dispatcher.child.log.suffix(2000))")
        #expect(ContinuousClock.now - stopping < .seconds(10))
        #expect(dispatcher.child.log.contains("consumer closed"))
        let lines = dispatcher.child.log.split(separator: "\n")
        #expect(lines.allSatisfy { (try? JSONDecoder().decode(JSONValue.self, from: Data($0.utf8)))?.objectValue != nil },
                "every log line is one JSON object")
        await ingest.child.stop()
        await simulator.child.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    @Test("/readyz says ready only once the group has assigned the dispatcher its partitions")
    func readyOnlyWhenAssigned() async throws {
        let directory = try scratchDirectory()
        let apps = try TestApps()
        let topics = try await TestTopics.make()
        let simulator = try SimulatorProcess(apps: apps, directory: directory)
        try await simulator.waitUntilListening()
        let dispatcher = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, directory: directory)
        var joining = 0
        let deadline = ContinuousClock.now + .seconds(60)
        while true {
            let ready = try? await dispatcher.get("/readyz")
            // Read after the probe: a ready answer must come from a member that already holds partitions.
            let assigned = await dispatcher.metric("herald_dispatcher_partitions_assigned") ?? 0
            if ready?.status == 200 {
                #expect(assigned > 0, "ready before any partition was assigned")
                break
            }
            if ready?.status == 503, ready?.text.contains("joining") == true { joining += 1 }
            try #require(ContinuousClock.now < deadline, "the dispatcher never became ready")
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(joining > 0, "never seen joining: Tansu forms a group in session.timeout/2, so the first probes must say so")
        await dispatcher.child.stop()
        await simulator.child.stop()
    }

    @Test("a fatal signal is never silent: one JSON line names it and the thread, then the process dies of it")
    func fatalSignalIsLogged() async throws {
        let directory = try scratchDirectory()
        let apps = try TestApps()
        defer { apps.remove() }
        let topics = try await TestTopics.make()
        let simulator = try SimulatorProcess(apps: apps, directory: directory)
        try await simulator.waitUntilListening()
        for (number, name) in [(SIGSEGV, "SIGSEGV"), (SIGABRT, "SIGABRT")] {
            let dispatcher = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, directory: directory,
                                                   name: "dispatcher-\(name)")
            try await eventually("the dispatcher started") { dispatcher.child.log.contains(#""msg":"started""#) }
            dispatcher.child.signal(number)
            _ = await dispatcher.child.waitForExit(timeout: .seconds(10))
            #expect(dispatcher.child.diedOfSignal == number, "\(name): \(dispatcher.child.log.suffix(1500))")
            let lines = dispatcher.child.log.split(separator: "\n").compactMap {
                try? JSONDecoder().decode(JSONValue.self, from: Data($0.utf8))
            }
            let report = try #require(lines.first { $0["msg"]?.stringValue == "fatal signal: the process dies" },
                                      "\(name): no crash line in \(dispatcher.child.log.suffix(1500))")
            #expect(report["signal"]?.stringValue == name)
            #expect(report["signal.sent_by"]?.stringValue == "process")
            #expect(report["logger"]?.stringValue == "herald.dispatcher")
            #expect(report["level"]?.stringValue == "error")
            #expect(report["thread"]?.stringValue?.isEmpty == false)
            #expect(report["backtrace"]?.stringValue?.hasPrefix("0x") == true)
            #expect(report["ts"]?.stringValue.flatMap(Timestamp.parse) != nil, "an RFC 3339 time like every line's")
        }
        await simulator.child.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    @Test("kill -9, or SIGTERM past the drain timeout, during a 20,000-subscriber fan-out: after a restart every token has its push, duplicates ≤ those in flight",
          arguments: [SIGKILL, SIGTERM])
    func killDuringFanOut(signal: Int32) async throws {
        let directory = try scratchDirectory()
        let apps = try TestApps()
        let topics = try await TestTopics.make()
        // Apple's round trip of tens of milliseconds, so pushes are in flight when the process dies; 200 in flight
        // at 40 ms (5,000 pushes/s) leave more than the 1 s drain to send when SIGTERM comes.
        let simulator = try SimulatorProcess(apps: apps, directory: directory, rules: [.object(["delayMs": .number(40)])])
        defer { apps.remove() }
        let app = apps.apps[0]
        let channel = "big-\(SecureRandom.hex(4))"
        let count = 20_000
        let tokens = try await seedChannel(app: app.id, channel: channel, count: count)
        let settings = ["HERALD_MAX_IN_FLIGHT_PUSHES": "200", "HERALD_KAFKA_SESSION_TIMEOUT_SECONDS": "3",
                        "HERALD_DRAIN_TIMEOUT_SECONDS": "1"]
        try await simulator.waitUntilListening()
        var dispatcher = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, directory: directory,
                                               name: "dispatcher-1", extra: settings)
        try await dispatcher.waitForAssignment()

        let job = try await produceFlashSale(to: channel, app: app.id, id: "big", apps: apps, topics: topics)

        try await eventually("a third of the fan-out was delivered", timeout: .seconds(60)) {
            simulator.acceptedCount() >= count / 3
        }
        let inFlight = try #require(await dispatcher.metric("herald_dispatcher_in_flight_pushes"))
        dispatcher.child.signal(signal)
        _ = await dispatcher.child.waitForExit(timeout: .seconds(15))
        let beforeRestart = simulator.acceptedCount()
        #expect(beforeRestart < count, "the fan-out finished before the process stopped; the test proves nothing")
        if signal == SIGTERM {
            #expect(dispatcher.child.log.contains("handing back unfinished jobs"), "the drain did not time out")
        }

        let restarted = ContinuousClock.now
        dispatcher = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, directory: directory,
                                           name: "dispatcher-2", extra: settings)
        // The restarted process's own count: the simulator's record file may still be catching up on the old one's.
        let restartedDispatcher = dispatcher
        try await eventually("a push from the restarted dispatcher", timeout: .seconds(60)) {
            await restartedDispatcher.metric("herald_dispatcher_pushes_total") ?? 0 > 0
        }
        let takeover = ContinuousClock.now - restarted
        let name = signal == SIGKILL ? "kill -9" : "SIGTERM"
        print("\(name) fan-out: first push \(takeover) after the restart")
        #expect(takeover <= .seconds(10), "the restarted dispatcher resumed after \(takeover)")
        let duplicates = try await everyTokenDelivered(tokens, simulator: simulator, job: job)
        try await expectDone(job, delivered: count)
        print("\(name) fan-out: \(beforeRestart) delivered before the kill, \(Int(inFlight)) in flight, \(duplicates) duplicates after the restart")
        #expect(Double(duplicates) <= inFlight, "\(duplicates) duplicates, \(inFlight) pushes in flight at the kill")
        #expect(duplicates <= count / 50, "\(duplicates) duplicates: over 2 % of the fan-out")
        // The pushes the first process marked settled past its saved cursor are left out on resume. There may be
        // none: a drain (or a save just before the kill) can leave every settled push behind the cursor.
        let resumed = try #require(dispatcher.child.log.split(separator: "\n").compactMap {
            try? JSONDecoder().decode(JSONValue.self, from: Data($0.utf8))
        }.first { $0["msg"]?.stringValue == "resuming a fan-out from its saved progress" }, "the fan-out did not resume")
        let marked = Double(resumed["pushes.settled"]?.stringValue ?? "") ?? -1
        let skipped = await dispatcher.metric("herald_dispatcher_resumed_pushes_skipped_total") ?? 0
        #expect(marked >= 0 && (marked == 0 || skipped > 0), "\(marked) marked settled, \(skipped) left out")
        await dispatcher.child.stop()
        await simulator.child.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    @Test("a second member joining mid fan-out: every token has its push, duplicates ≤ the pushes in flight")
    func memberJoinsDuringFanOut() async throws {
        let directory = try scratchDirectory()
        let apps = try TestApps()
        let topics = try await TestTopics.make(partitions: 4)
        let simulator = try SimulatorProcess(apps: apps, directory: directory, rules: [.object(["delayMs": .number(40)])])
        defer { apps.remove() }
        let app = apps.apps[0]
        let channel = "join-\(SecureRandom.hex(4))"
        let count = 20_000
        let tokens = try await seedChannel(app: app.id, channel: channel, count: count)
        // 100 in flight at 40 ms: about 2,500 pushes/s, so the rebalance comes well before the end.
        let maxInFlight = 100
        let settings = ["HERALD_MAX_IN_FLIGHT_PUSHES": "\(maxInFlight)", "HERALD_KAFKA_SESSION_TIMEOUT_SECONDS": "3"]
        try await simulator.waitUntilListening()
        let first = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, directory: directory,
                                          name: "dispatcher-a", extra: settings)
        try await first.waitForAssignment()
        let job = try await produceFlashSale(to: channel, app: app.id, id: "join", apps: apps, topics: topics)
        try await eventually("a tenth of the fan-out was delivered", timeout: .seconds(60)) {
            simulator.acceptedCount() >= count / 10
        }
        let second = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, directory: directory,
                                           name: "dispatcher-b", extra: settings)
        try await eventually("both members own partitions", timeout: .seconds(60)) {
            let a = await first.metric("herald_dispatcher_partitions_assigned") ?? 0
            let b = await second.metric("herald_dispatcher_partitions_assigned") ?? 0
            return a > 0 && b > 0 && a + b == 4
        }
        #expect(simulator.acceptedCount() < count, "the fan-out finished before the rebalance; the test proves nothing")
        let duplicates = try await everyTokenDelivered(tokens, simulator: simulator, job: job)
        try await expectDone(job, delivered: count)
        var resumed = 0.0
        for member in [first, second] { resumed += await member.metric("herald_dispatcher_fanouts_resumed_total") ?? 0 }
        print("member joining mid fan-out: \(duplicates) duplicates, fan-out resumed \(Int(resumed)) times")
        #expect(resumed >= 1, "the rebalance did not hand the job over")
        #expect(duplicates <= maxInFlight, "\(duplicates) duplicates, at most \(maxInFlight) pushes in flight")
        await first.child.stop()
        await second.child.stop()
        await simulator.child.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Waits until every token received the job's push and returns how many it received more than once. Every
    /// push carries the apns-id derived from the job and its token, before and after a restart alike: a
    /// duplicate is recognisable as one.
    /// The job's status ends `done`, each push counted once however many went out twice.
    private func expectDone(_ job: PushJob, delivered: Int) async throws {
        let redis = RedisClient(configuration: try RedisConfiguration(url: try TestEnvironment.redisURL()))
        let statuses = JobStatusStore(redis: redis)
        try await eventually("the job's status is done") {
            (try? await statuses.read(app: job.appId, jobID: job.id))?.state == .done
        }
        var expected = JobStatus.Counts()
        expected.delivered = delivered
        #expect(try await statuses.read(app: job.appId, jobID: job.id)?.counts == expected)
        await redis.close()
    }

    private func everyTokenDelivered(_ tokens: [String], simulator: SimulatorProcess, job: PushJob) async throws -> Int {
        try await eventually("every token received the push", timeout: .seconds(180)) {
            Set(simulator.accepted().compactMap { $0["token"]?.stringValue }).count >= tokens.count
        }
        try await Task.sleep(for: .seconds(1))
        let records = simulator.accepted()
        let accepted = records.compactMap { $0["token"]?.stringValue }
        #expect(Set(accepted) == Set(tokens))
        for record in records {
            let token = try #require(record["token"]?.stringValue)
            #expect(record["apnsId"]?.stringValue == job.apnsID(token: token).uuidString.lowercased())
        }
        return accepted.count - tokens.count
    }

    @Test("two dispatcher processes in one group share the partitions and deliver every job once")
    func twoDispatchers() async throws {
        let directory = try scratchDirectory()
        let apps = try TestApps()
        let topics = try await TestTopics.make(partitions: 4)
        let simulator = try SimulatorProcess(apps: apps, directory: directory)
        defer { apps.remove() }
        try await simulator.waitUntilListening()
        let first = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, directory: directory,
                                          name: "dispatcher-a")
        let second = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, directory: directory,
                                           name: "dispatcher-b")
        try await eventually("both members own partitions", timeout: .seconds(90)) {
            let a = await first.metric("herald_dispatcher_partitions_assigned") ?? 0
            let b = await second.metric("herald_dispatcher_partitions_assigned") ?? 0
            return a > 0 && b > 0 && a + b == 4
        }
        let app = apps.apps[0]
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(
            kafka: KafkaConfiguration(brokerList: topics.brokers)), logger: testLogger)
        let tokens: [String] = (0..<200).map { _ in deviceToken() }
        for (index, token) in tokens.enumerated() {
            var job = PushJob(id: "two-\(index)", appId: app.id, target: .device(token, tokenType: .alert, environment: .production))
            job.payload = .object(["aps": .object(["alert": .string("job \(index)")])])
            _ = try await producer.send(topic: topics.jobs, key: job.recordKey, value: job.encoded(),
                                        headers: apps.signatureHeaders(job.encoded()))
        }
        await producer.close()
        try await eventually("every job was delivered") { simulator.acceptedCount() >= tokens.count }
        try await Task.sleep(for: .seconds(1))
        let accepted = simulator.accepted().compactMap { $0["token"]?.stringValue }
        #expect(accepted.count == tokens.count, "each job once")
        #expect(Set(accepted) == Set(tokens))
        let a = await first.metric("herald_dispatcher_jobs_consumed_total") ?? 0
        let b = await second.metric("herald_dispatcher_jobs_consumed_total") ?? 0
        #expect(a > 0 && b > 0 && a + b == 200, "consumed \(a) + \(b)")
        await first.child.stop()
        await second.child.stop()
        await simulator.child.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    @Test("a member killed mid fan-out and not restarted: the other finishes the job within the session timeout plus 10 s")
    func killedMemberIsReplaced() async throws {
        let directory = try scratchDirectory()
        let apps = try TestApps()
        let topics = try await TestTopics.make(partitions: 4)
        let simulator = try SimulatorProcess(apps: apps, directory: directory)
        defer { apps.remove() }
        let app = apps.apps[0]
        let channel = "takeover-\(SecureRandom.hex(4))"
        let count = 3_000
        let tokens = try await seedChannel(app: app.id, channel: channel, count: count)
        let session = 3
        let settings = ["HERALD_FANOUT_BATCH_SIZE": "100", "HERALD_MAX_IN_FLIGHT_PUSHES": "100",
                        "HERALD_KAFKA_SESSION_TIMEOUT_SECONDS": "\(session)"]
        try await simulator.waitUntilListening()
        let members = try ["dispatcher-a", "dispatcher-b"].map {
            try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, directory: directory, name: $0,
                                  extra: settings)
        }
        try await eventually("both members own partitions", timeout: .seconds(90)) {
            var owned: [Double] = []
            for member in members { owned.append(await member.metric("herald_dispatcher_partitions_assigned") ?? 0) }
            return owned.allSatisfy { $0 > 0 } && owned.reduce(0, +) == 4
        }
        _ = try await produceFlashSale(to: channel, app: app.id, id: "takeover", apps: apps, topics: topics)
        try await eventually("a fifth of the fan-out was delivered", timeout: .seconds(60)) {
            simulator.acceptedCount() >= count / 5
        }
        // The member running the job is the one with pushes in flight.
        var running: DispatcherProcess?
        for member in members where await member.metric("herald_dispatcher_in_flight_jobs") ?? 0 > 0 { running = member }
        let victim = try #require(running, "no member was running the job")
        victim.child.signal(SIGKILL)
        _ = await victim.child.waitForExit(timeout: .seconds(5))
        let killed = ContinuousClock.now
        #expect(simulator.acceptedCount() < count, "the fan-out finished before the kill; the test proves nothing")
        try await eventually("every token received the push", timeout: .seconds(session + 10)) {
            Set(simulator.accepted().compactMap { $0["token"]?.stringValue }).count >= count
        }
        print("member killed mid fan-out: the other finished the job \(ContinuousClock.now - killed) after the kill")
        #expect(Set(simulator.accepted().compactMap { $0["token"]?.stringValue }) == Set(tokens))
        for member in members where member.child.pid != victim.child.pid { await member.child.stop() }
        await simulator.child.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Produces one signed alert job to `channel` and returns it.
    private func produceFlashSale(to channel: String, app: String, id: String, apps: TestApps,
                                  topics: TestTopics) async throws -> PushJob {
        var job = PushJob(id: "\(id)-\(SecureRandom.hex(4))", appId: app, target: .channel(channel))
        job.alert = .object(["aps": .object(["alert": .string("flash sale")])])
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(
            kafka: KafkaConfiguration(brokerList: topics.brokers)), logger: testLogger)
        _ = try await producer.send(topic: topics.jobs, key: job.recordKey, value: job.encoded(),
                                    headers: apps.signatureHeaders(job.encoded()))
        await producer.close()
        return job
    }

    /// Subscribes `count` fresh alert tokens to `channel`, 64 at a time.
    private func seedChannel(app: String, channel: String, count: Int) async throws -> [String] {
        let redis = RedisClient(configuration: try RedisConfiguration(url: try TestEnvironment.redisURL()))
        let store = SubscriptionStore(redis: redis)
        let tokens: [String] = (0..<count).map { _ in deviceToken() }
        for start in stride(from: 0, to: count, by: 64) {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for token in tokens[start..<min(count, start + 64)] {
                    group.addTask {
                        _ = try await store.upsert(app: app, SubscriptionInput(.object([
                            "channel": .string(channel), "deviceToken": .string(token), "tokenType": .string("alert"),
                        ])))
                    }
                }
                try await group.waitForAll()
            }
        }
        await redis.close()
        return tokens
    }
}
