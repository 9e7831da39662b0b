import Foundation
import HeraldCrypto
import HeraldRuntime
import HeraldTestSupport
import Testing

/// Several processes of each service on one machine against one Redis and one broker.
@Suite("Scale on one machine", .serialized)
struct ScaleTests {
    @Test("two ingests, two dispatchers, one dispatcher killed -9 and restarted under load: every event delivered, the group rebalanced")
    func killAndRestartUnderLoad() async throws {
        let directory = try scratchDirectory("herald-scale-")
        let apps = try TestApps()
        defer { apps.remove() }
        let topics = try await TestTopics.make(partitions: 4)
        let simulator = try SimulatorProcess(apps: apps, directory: directory)
        // 200 subscriptions and 400 events share one key of each kind across both ingests.
        let ingestSettings = ["HERALD_RATE_LIMIT_PER_MINUTE": "100000"]
        let ingests = [
            try IngestProcess(apps: apps, topics: topics, directory: directory, name: "ingest-a", extra: ingestSettings),
            try IngestProcess(apps: apps, topics: topics, directory: directory, name: "ingest-b", extra: ingestSettings),
        ]
        try await simulator.waitUntilListening() // its CA file exists from then on, and the dispatchers read it at start
        let first = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, directory: directory,
                                          name: "dispatcher-a")
        var second = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, directory: directory,
                                           name: "dispatcher-b")
        for ingest in ingests { try await ingest.waitUntilReady() }
        let initial = second
        try await eventually("both dispatchers own partitions", timeout: .seconds(60)) {
            await Self.ownsAllPartitions(first, initial)
        }

        let app = apps.apps[0]
        let run = SecureRandom.hex(4)
        let channels = (0..<200).map { "scale-\(run)-\($0)" }
        let tokens = channels.map { _ in deviceToken() }
        for (index, (channel, token)) in zip(channels, tokens).enumerated() {
            let created = try await ingests[index % 2].request("POST", "/v1/apps/\(app.id)/subscriptions", key: app.publicKey,
                                                              json: #"{"channel": "\#(channel)", "deviceToken": "\#(token)", "tokenType": "alert"}"#)
            try #require(created.status == 201, "\(created.text)")
        }

        // 400 events at 40 per second, alternating ingests; event n goes to channel n % 200, so every token is owed
        // two pushes. Dispatcher b is killed at event 160 and started again (same group) a second later.
        let eventCount = 400, killAt = 160, restartAt = 200
        let clock = ContinuousClock()
        let start = clock.now
        var killedAt = start
        for index in 0..<eventCount {
            if index == killAt {
                second.child.signal(SIGKILL)
                _ = await second.child.waitForExit(timeout: .seconds(5))
                killedAt = clock.now
            }
            if index == restartAt {
                second = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, directory: directory,
                                               name: "dispatcher-b-restarted")
            }
            let event = try await ingests[index % 2].request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey, json: """
                {"channel": "\(channels[index % channels.count])", "alert": {"aps": {"alert": {"title": "event \(index)"}}, "n": \(index)}}
                """)
            try #require(event.status == 202, "event \(index): \(event.status) \(event.text)")
            try await Task.sleep(until: start + .milliseconds(25 * (index + 1)), clock: .continuous)
        }
        let streamed = clock.now - start
        #expect(killedAt > start, "the kill happened while events were streaming")

        try await eventually("every event was delivered", timeout: .seconds(45)) {
            Set(simulator.accepted().compactMap { $0[path: "payload", "n"]?.numberValue }).count >= eventCount
        }
        let restarted = second
        try await eventually("the restarted dispatcher owns partitions again", timeout: .seconds(45)) {
            await Self.ownsAllPartitions(first, restarted)
        }
        let drained = clock.now - start
        try await Task.sleep(for: .seconds(1)) // late duplicates show up too
        let accepted = simulator.accepted()
        let delivered = accepted.compactMap { $0[path: "payload", "n"]?.numberValue }.map { Int($0) }
        #expect(Set(delivered) == Set(0..<eventCount), "every accepted event delivered")
        var pushesPerToken: [String: Int] = [:]
        for record in accepted { pushesPerToken[record["token"]?.stringValue ?? "?", default: 0] += 1 }
        #expect(tokens.allSatisfy { pushesPerToken[$0, default: 0] >= 2 }, "every token got both of its pushes")
        #expect(Set(pushesPerToken.keys) == Set(tokens), "no push to anyone else")

        // Duplicates come only from jobs a member had fetched but not committed when it died or lost a partition:
        // offsets are committed every 100 ms and a push takes milliseconds, so that is a fraction of a second of the
        // stream per kill or rebalance. One second of the whole stream (40 events) is the bound.
        let duplicates = delivered.count - eventCount
        #expect(duplicates >= 0 && duplicates <= 40, "\(duplicates) duplicates")

        let deadLetters = try await readTopic(topics.deadLetters, brokers: topics.brokers, expecting: 0, timeout: .seconds(1))
        #expect(deadLetters.isEmpty, "\(deadLetters.count) dead letters")
        let a = await first.metric("herald_dispatcher_partitions_assigned") ?? 0
        let b = await restarted.metric("herald_dispatcher_partitions_assigned") ?? 0
        print("scale: streamed \(eventCount) events in \(streamed), all delivered and rebalanced after \(drained); "
              + "\(duplicates) duplicates; partitions \(Int(a)) + \(Int(b))")

        await first.child.stop()
        await restarted.child.stop()
        for ingest in ingests { await ingest.child.stop() }
        await simulator.child.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Both members own partitions and together all four.
    private static func ownsAllPartitions(_ first: DispatcherProcess, _ second: DispatcherProcess) async -> Bool {
        let a = await first.metric("herald_dispatcher_partitions_assigned") ?? 0
        let b = await second.metric("herald_dispatcher_partitions_assigned") ?? 0
        return a > 0 && b > 0 && a + b == 4
    }
}
