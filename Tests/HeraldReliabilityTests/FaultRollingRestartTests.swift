import Foundation
import HeraldTestSupport
import Testing

@Suite("Fault injection: rolling restart", .serialized)
struct FaultRollingRestartTests {
    /// Two ingests (the stream sends to each in turn and, like a load balancer, to the other when a connection
    /// fails) and two dispatchers in one group on 4 partitions (shared Redis and broker). Under 40 events a second,
    /// each process in turn gets SIGTERM, must exit 0, and is replaced by a new one: ingest a, ingest b,
    /// dispatcher a, dispatcher b — the next only once its predecessor's replacement is serving.
    @Test("SIGTERM rolling restart of both ingests and both dispatchers under load: nothing accepted lost, duplicates within the bound")
    func rollingRestart() async throws {
        let started = ContinuousClock.now
        let directory = try scratchDirectory("herald-fault-rolling-")
        let apps = try TestApps(count: 1)
        defer { apps.remove() }
        let redisURL = try TestEnvironment.redisURL()
        let topics = FaultTopics(brokers: try TestEnvironment.kafkaBrokers())
        try await topics.create(partitions: 4)
        let simulator = try SimulatorProcess(apps: apps, directory: directory)
        var ingests = [
            try IngestServer(apps: apps, redisURL: redisURL, topics: topics, directory: directory, name: "ingest-a0"),
            try IngestServer(apps: apps, redisURL: redisURL, topics: topics, directory: directory, name: "ingest-b0"),
        ]
        try await simulator.waitUntilListening()
        var dispatchers = [
            try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, redisURL: redisURL,
                                  directory: directory, name: "dispatcher-a0"),
            try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, redisURL: redisURL,
                                  directory: directory, name: "dispatcher-b0"),
        ]
        for ingest in ingests { try await ingest.waitUntilReady() }
        let app = apps.apps[0]
        let perChannel = 3, perSecond = 40
        let audience = try await Audience.subscribe(app: app, through: ingests[0], channelCount: 16, perChannel: perChannel)
        let initial = dispatchers
        try await eventually("both dispatchers own partitions", timeout: .seconds(60)) { await Self.shareAll(initial) }

        let stream = EventStream(app: app, audience: audience, targets: ingests, perSecond: perSecond)
        stream.start()
        var exits: [String: Int32?] = [:]
        let names = ["a", "b"]
        for index in 0..<2 {
            try await Task.sleep(for: .seconds(1))
            let old = ingests[index]
            old.child.signal(SIGTERM)
            exits[old.child.logPath] = await old.child.waitForExit(timeout: .seconds(30))
            ingests[index] = try IngestServer(apps: apps, redisURL: redisURL, topics: topics, directory: directory,
                                              name: "ingest-\(names[index])1")
            try await ingests[index].waitUntilReady()
            stream.setTargets(ingests)
        }
        var rebalances: [Duration] = []
        for index in 0..<2 {
            try await Task.sleep(for: .seconds(1))
            let old = dispatchers[index]
            let stoppedAt = ContinuousClock.now
            old.child.signal(SIGTERM)
            exits[old.child.logPath] = await old.child.waitForExit(timeout: .seconds(30))
            dispatchers[index] = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, redisURL: redisURL,
                                                       directory: directory, name: "dispatcher-\(names[index])1")
            let current = dispatchers
            try await eventually("both dispatchers own partitions again", timeout: .seconds(60)) { await Self.shareAll(current) }
            rebalances.append(ContinuousClock.now - stoppedAt)
        }
        try await Task.sleep(for: .seconds(1))
        await stream.stop()

        let tally = try await Tally.settle(stream: stream, simulator: simulator, topics: topics, timeout: .seconds(60))
        #expect(exits.values.allSatisfy { $0 == 0 }, "exit statuses \(exits)")
        // A request to a stopping ingest is answered, or its connection refused and the event sent to the other.
        // Seen once in about ten CI runs: one request of ~500 refused (503, or its connection cut on both) during a
        // stop. A refusal is the client's to retry and is not a loss; more than two would be a drain that fails.
        let refusals = stream.outcomes.filter { $0.value.status != 202 }
            .map { "event \($0.key): status \($0.value.status) after \($0.value.answeredAt - $0.value.sentAt)" }
        if !refusals.isEmpty { print("FAULT rolling restart: refused during the restarts: \(refusals)") }
        #expect(tally.attempted > 0 && refusals.count <= 2, "\(tally); refused: \(refusals)")
        #expect(tally.missing.count == 0, "missing pushes: \(tally.missing.count), first \(tally.missing.prefix(3))")
        #expect(tally.delivered == tally.owed && tally.deadLettered == 0, "\(tally)")
        #expect(tally.strangers == 0)
        // README: on SIGTERM a dispatcher finishes its jobs, commits and leaves, so it hands over nothing settled.
        // What a rebalance can repeat is a survivor's jobs settled in the last commit interval (100 ms) before its
        // partitions were revoked: 4 rebalances × 100 ms of the stream × 3 tokens, rounded up to a second in all.
        #expect(tally.duplicates <= perSecond * perChannel, "\(tally.duplicates) duplicates")
        report("rolling restart (SIGTERM)", tally, faults: "4 × SIGTERM + replacement (2 ingests, 2 dispatchers; "
               + "group whole again after \(rebalances))", started: started)

        for dispatcher in dispatchers { await dispatcher.child.stop() }
        for ingest in ingests { await ingest.child.stop() }
        await simulator.child.stop()
        cleanUp(directory, keep: tally.missing.count > 0 || tally.strangers > 0 || tally.deadLettered > 0)
    }

    /// Both members own partitions and together all four.
    private static func shareAll(_ dispatchers: [DispatcherProcess]) async -> Bool {
        var owned: [Double] = []
        for dispatcher in dispatchers { owned.append(await dispatcher.metric("herald_dispatcher_partitions_assigned") ?? 0) }
        return owned.allSatisfy { $0 > 0 } && owned.reduce(0, +) == 4
    }
}
