import Foundation
import HeraldCore
import HeraldCrypto
@testable import HeraldDispatcher
import HeraldKafka
import HeraldTestSupport
import Synchronization
import Testing

@Suite("Fetch stalls and gaps", .serialized)
struct FetchStallTests {
    /// Tansu answers fetches empty, for good, once looking an offset up outlasts the fetch wait; it does so only
    /// under some loads, so the test injects the stall instead: once the first consumer has received 200 records,
    /// every poll it makes comes back empty, as a stalled broker's fetches do, while records stay on the broker.
    /// Only the replacement, with a longer fetch wait, reads on.
    ///
    /// The test has a broker of its own, so the shared broker's load does not change its timing.
    @Test("a consumer whose fetches come back empty with records left is replaced with a longer fetch wait and reads every partition to its end")
    func stalledFetchesRecover() async throws {
        let broker = try await TansuBroker.started(directory: try scratchDirectory("herald-fetch-stall-"))
        let harness = try await DispatcherHarness.start(brokers: broker.address) { configuration in
            configuration.fetchMaxWait = .milliseconds(10)
            configuration.fetchStallRecovery = FetchStallRecovery(stallTimeout: .seconds(2))
            configuration.injectedFetchStall = InjectedFetchStall(fetchWaitBelow: .milliseconds(40), afterRecords: 200)
        }
        let total = try await Self.produceJobsToEmptyChannels(harness, producers: 8, perProducer: 250, prefix: "stall")
        // The stall timeout, a drain and a rejoin (the group forms in session.timeout/2): ~10 s on an idle box.
        try await Self.waitUntilCommittedToTheEnd(harness, total: total, timeout: .seconds(90))
        #expect((harness.metric("herald_dispatcher_jobs_completed_total") ?? 0) >= Double(total))
        #expect((harness.metric("herald_dispatcher_fetch_stalls_total") ?? 0) >= 1)
        await harness.stop()
        await broker.crash()
    }

    /// Tansu also, under load, now and then answers a fetch with one record left out of the middle (a fresh reader
    /// gets it afterwards). The test injects that gap: every record at a multiple of 41 is left out of the fetch it
    /// first arrives in. Each must still run exactly once, and the commits reach each partition's end.
    @Test("records a fetch left out are read again, run once, and no commit passes them meanwhile")
    func skippedOffsetsAreReadAgain() async throws {
        let harness = try await DispatcherHarness.start { configuration in
            configuration.injectedOffsetGap = InjectedOffsetGap(every: 41)
            // Four keys of 250 jobs: a pause for a busy key would read most gaps again before they were seen.
            configuration.maxJobsPerKey = 1_000
        }
        let total = try await Self.produceJobsToEmptyChannels(harness, producers: 4, perProducer: 250, prefix: "gap")
        try await Self.waitUntilCommittedToTheEnd(harness, total: total, timeout: .seconds(60))
        let gaps = harness.metric("herald_dispatcher_offset_gaps_total") ?? 0
        #expect(gaps >= 1, "no record was left out: the test did not exercise a gap")
        #expect(harness.metric("herald_dispatcher_offset_rereads_total") ?? 0 >= 1)
        #expect(harness.metric("herald_dispatcher_offsets_missing") == 0)
        // Every record ran once: the left-out ones after their re-read, the repeats of a re-read not again.
        #expect(harness.metric("herald_dispatcher_jobs_completed_total") == Double(total))
        #expect(harness.metric("herald_dispatcher_jobs_consumed_total") == Double(total))
        await harness.stop()
    }

    /// The same gap in the first answer after a rebalance: nothing received yet tells the partition where it
    /// starts but the group's committed offset. A member joins and leaves, so the dispatcher's partitions are
    /// assigned again (with offsets committed); the first record each then receives is left out once. Every job
    /// must still run once.
    @Test("a record left out of the first fetch after a rebalance is read again and run once")
    func aRecordLeftOutAfterARebalanceIsReadAgain() async throws {
        let harness = try await DispatcherHarness.start { configuration in
            configuration.injectedOffsetGap = InjectedOffsetGap(firstAfterAssignment: true)
        }
        // Both partitions get records before and after: a partition's very first record (offset 0) is never left out.
        func produceToEachPartition(_ prefix: String) async throws -> Int {
            let app = harness.apps.apps[0]
            for partition: Int32 in [0, 1] {
                for index in 0..<50 {
                    var job = PushJob(id: "\(prefix)-\(partition)-\(index)", appId: app.id,
                                      target: .channel("\(prefix)-\(partition)-\(SecureRandom.hex(4))"))
                    job.alert = .object(["aps": .object(["alert": .string("\(index)")])])
                    try await harness.produce(job, partition: partition)
                }
            }
            return 100
        }
        let before = try await produceToEachPartition("before")
        try await Self.waitUntilCommittedToTheEnd(harness, total: before, timeout: .seconds(30))
        #expect(harness.metric("herald_dispatcher_offset_gaps_total") == 0, "offset 0 is never left out")

        let joined = Atomic<Bool>(false)
        let member = try KafkaConsumer(configuration: KafkaConsumerConfiguration(
            kafka: KafkaConfiguration(brokerList: harness.topics.brokers), groupID: harness.topics.group,
            sessionTimeout: .seconds(3), heartbeatInterval: .milliseconds(500)), logger: testLogger,
            onRebalance: { event in
                if case .assigned(let partitions) = event, !partitions.isEmpty { joined.store(true, ordering: .relaxed) }
                return []
            })
        try await member.subscribe(topics: [harness.topics.jobs])
        try await eventually("a second member took a partition", timeout: .seconds(30)) {
            _ = try await member.poll(maxRecords: 1, timeout: .milliseconds(100))
            return joined.load(ordering: .relaxed) && harness.metric("herald_dispatcher_partitions_assigned") == 1
        }
        try await member.close()
        try await eventually("the dispatcher has both partitions again", timeout: .seconds(30)) {
            harness.metric("herald_dispatcher_partitions_assigned") == 2
        }

        let after = try await produceToEachPartition("after")
        try await Self.waitUntilCommittedToTheEnd(harness, total: before + after, timeout: .seconds(30))
        #expect(harness.metric("herald_dispatcher_offset_gaps_total") ?? 0 >= 2, "one record left out of each partition")
        #expect(harness.metric("herald_dispatcher_offsets_missing") == 0)
        #expect(harness.metric("herald_dispatcher_jobs_completed_total") == Double(before + after))
        await harness.stop()
    }

    /// Produces `producers` × `perProducer` jobs, each producer to its own channel without subscribers (every job
    /// settles at once); returns how many.
    private static func produceJobsToEmptyChannels(_ harness: DispatcherHarness, producers: Int, perProducer: Int,
                                                   prefix: String) async throws -> Int {
        let app = harness.apps.apps[0]
        let channel = "\(prefix)-\(SecureRandom.hex(4))"
        try await withThrowingTaskGroup(of: Void.self) { group in
            for sender in 0..<producers {
                group.addTask {
                    for index in 0..<perProducer {
                        var job = PushJob(id: "\(prefix)-\(sender)-\(index)", appId: app.id, target: .channel("\(channel)-\(sender)"))
                        job.alert = .object(["aps": .object(["alert": .string("\(index)")])])
                        try await harness.produce(job)
                    }
                }
            }
            try await group.waitForAll()
        }
        return producers * perProducer
    }

    /// Reads what the broker holds from the start, outside the group (each partition's end), and waits until the
    /// group's committed offsets reach every end.
    /// Jobs settled since the last periodic commit are committed as their partitions are revoked: the next owner
    /// starts after them instead of running them again (the duplicates of a rolling restart).
    @Test("settled jobs are committed when their partitions are revoked")
    func settledJobsAreCommittedOnRevocation() async throws {
        let harness = try await DispatcherHarness.start { configuration in
            configuration.commitInterval = .seconds(3600)  // no periodic commit within the test
        }
        let app = harness.apps.apps[0]
        for partition: Int32 in [0, 1] {
            for index in 0..<10 {
                var job = PushJob(id: "settled-\(partition)-\(index)", appId: app.id,
                                  target: .channel("nobody-\(SecureRandom.hex(4))"))
                job.alert = .object(["aps": .object(["alert": .string("\(index)")])])
                try await harness.produce(job, partition: partition)
            }
        }
        try await eventually("every job settled") { harness.metric("herald_dispatcher_jobs_completed_total") == 20 }
        let taken = Mutex<[KafkaTopicPartition]>([])
        let member = try KafkaConsumer(configuration: KafkaConsumerConfiguration(
            kafka: KafkaConfiguration(brokerList: harness.topics.brokers), groupID: harness.topics.group,
            sessionTimeout: .seconds(3), heartbeatInterval: .milliseconds(500)), logger: testLogger,
            onRebalance: { event in
                if case .assigned(let partitions) = event, !partitions.isEmpty { taken.withLock { $0 = partitions } }
                return []
            })
        try await member.subscribe(topics: [harness.topics.jobs])
        try await eventually("a second member took a partition", timeout: .seconds(30)) {
            _ = try await member.poll(maxRecords: 1, timeout: .milliseconds(100))
            return !taken.withLock { $0 }.isEmpty
        }
        let committed = try await member.committed(taken.withLock { $0 })
        #expect(!committed.isEmpty && committed.allSatisfy { $0.offset == 10 }, "\(committed)")
        try await member.close()
        await harness.stop()
    }

    private static func waitUntilCommittedToTheEnd(_ harness: DispatcherHarness, total: Int, timeout: Duration) async throws {
        let held = try await readTopic(harness.topics.jobs, brokers: harness.topics.brokers, expecting: total,
                                       timeout: .seconds(30))
        #expect(held.count == total)
        let ends = Dictionary(grouping: held, by: \.partition).mapValues { ($0.map(\.offset).max() ?? -1) + 1 }
        let committed = try KafkaConsumer(configuration: KafkaConsumerConfiguration(
            kafka: KafkaConfiguration(brokerList: harness.topics.brokers), groupID: harness.topics.group),
            logger: testLogger)
        try await eventually("the group committed every partition to its end", timeout: timeout) {
            let positions = try await committed.committed(ends.keys.map {
                KafkaTopicPartition(topic: harness.topics.jobs, partition: $0)
            })
            return positions.allSatisfy { $0.offset == ends[$0.partition] }
        }
        try await committed.close()
    }

    @Test("the watchdog reports a lagging partition whose position has not moved for the stall timeout")
    func watchdog() {
        let partition = KafkaTopicPartition(topic: "t", partition: 0)
        let other = KafkaTopicPartition(topic: "t", partition: 1)
        var watchdog = FetchWatchdog(stallTimeout: .seconds(5))
        let start = ContinuousClock.now
        func reading(_ position: Int64, _ high: Int64, _ otherPosition: Int64 = 10) -> [KafkaPartitionProgress] {
            [KafkaPartitionProgress(partition: partition, position: position, highWatermark: high),
             KafkaPartitionProgress(partition: other, position: otherPosition, highWatermark: 10)]
        }
        #expect(watchdog.stalled(reading(100, 200), now: start).isEmpty)
        #expect(watchdog.stalled(reading(100, 250), now: start + .seconds(4)).isEmpty)
        #expect(watchdog.stalled(reading(100, 250), now: start + .seconds(5)).map(\.partition) == [partition])
        // Moving again restarts the clock; caught-up partitions (lag 0) never stall.
        #expect(watchdog.stalled(reading(101, 250), now: start + .seconds(6)).isEmpty)
        #expect(watchdog.stalled(reading(101, 250), now: start + .seconds(10)).isEmpty)
        #expect(watchdog.stalled(reading(101, 250), now: start + .seconds(11)).map(\.partition) == [partition])
        #expect(watchdog.stalled(reading(250, 250), now: start + .seconds(30)).isEmpty)
        // An unknown position (-1001) or watermark (-1) is no evidence of a stall.
        #expect(watchdog.stalled(reading(-1001, 250), now: start + .seconds(40)).isEmpty)
        #expect(watchdog.stalled(reading(-1001, 250), now: start + .seconds(50)).isEmpty)
        #expect(watchdog.stalled(reading(5, -1), now: start + .seconds(60)).isEmpty)
    }

    @Test("a consumer that replaced a stalled one and receives nothing for twice the stall timeout counts as stalled, unless nothing is left")
    func silentReplacement() {
        let partition = KafkaTopicPartition(topic: "t", partition: 0)
        func reading(_ position: Int64, _ high: Int64) -> [KafkaPartitionProgress] {
            [KafkaPartitionProgress(partition: partition, position: position, highWatermark: high)]
        }
        var watchdog = FetchWatchdog(stallTimeout: .seconds(5))
        let start = ContinuousClock.now
        func silent(_ progress: [KafkaPartitionProgress], after seconds: Int) -> Bool {
            watchdog.silentSinceReplacement(progress, now: start + .seconds(seconds))
        }
        #expect(!silent(reading(5, -1), after: 60), "never replaced: no stall")
        watchdog.replaced(at: start)
        #expect(!silent(reading(5, -1), after: 9))
        #expect(silent(reading(5, -1), after: 10), "watermark unknown")
        #expect(silent(reading(-1001, 7), after: 10), "position unknown")
        #expect(silent(reading(5, 7), after: 10), "records left")
        watchdog.recordsArrived()
        #expect(!silent(reading(5, -1), after: 60))

        // An idle topic: the broker reports the partition read to its end, so the replacement is left alone for good.
        watchdog.replaced(at: start)
        #expect(!silent(reading(7, 7), after: 10))
        #expect(!silent(reading(5, -1), after: 60), "no longer a replacement")
        // The group gave every partition to other members: nothing to receive either.
        watchdog.replaced(at: start)
        #expect(!silent([], after: 10))
        #expect(!silent(reading(5, -1), after: 60))
    }
}
