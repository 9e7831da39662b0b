import Foundation
import HeraldCore
import HeraldCrypto
@testable import HeraldDispatcher
import HeraldKafka
import HeraldTestSupport
import Testing

@Suite("Fetch stalls", .serialized)
struct FetchStallTests {
    /// Tansu answers a fetch with no records once looking the offset up takes longer than the fetch wait, and the
    /// lookup grows with the partition's length. With a 1 ms fetch wait that happens within a few thousand records
    /// per partition; without the watchdog the dispatcher then stops consuming for good (the 30-minute soak's stall,
    /// at the default 10 ms, after ~12,000–18,000 records per partition).
    ///
    /// The test has a broker of its own: the shared one holds every record of the run so far, which slows each
    /// lookup so much that even a 4 ms fetch wait crawled (one CI run: 765 of 3,500 records in 150 s).
    @Test("a consumer whose fetches come back empty with records left is replaced with a longer fetch wait and reads every partition to its end")
    func stalledFetchesRecover() async throws {
        let broker = try await TansuBroker.started(directory: try scratchDirectory("herald-fetch-stall-"))
        let harness = try await DispatcherHarness.start(brokers: broker.address) { configuration in
            configuration.fetchMaxWait = .milliseconds(1)
            configuration.fetchStallTimeout = .seconds(2)
        }
        let app = harness.apps.apps[0]
        let channel = "empty-\(SecureRandom.hex(4))" // no subscribers: every job settles at once
        // Tansu's lookup grows with the number of record batches, so every record is a batch of its own: each of
        // 24 producers sends one record at a time (the ingest's pattern at low rates), each to its own channel.
        let producers = 24, perProducer = 250, total = producers * perProducer
        try await withThrowingTaskGroup(of: Void.self) { group in
            for sender in 0..<producers {
                group.addTask {
                    let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(
                        kafka: KafkaConfiguration(brokerList: harness.topics.brokers)), logger: testLogger)
                    for index in 0..<perProducer {
                        var job = PushJob(id: "stall-\(sender)-\(index)", appId: app.id, target: .channel("\(channel)-\(sender)"))
                        job.alert = .object(["aps": .object(["alert": .string("\(index)")])])
                        _ = try await producer.send(topic: harness.topics.jobs, key: job.recordKey, value: job.encoded())
                    }
                    await producer.close()
                }
            }
            try await group.waitForAll()
        }
        // What the broker holds, read from the start outside the group: each partition's end.
        let held = try await readTopic(harness.topics.jobs, brokers: harness.topics.brokers, expecting: total,
                                       timeout: .seconds(30))
        #expect(held.count == total)
        let ends = Dictionary(grouping: held, by: \.partition).mapValues { ($0.map(\.offset).max() ?? -1) + 1 }
        // Liveness, not speed: each escalation of the fetch wait (1 → 4 → 16 … ms) costs the stall timeout plus a
        // rejoin (on an idle box the whole test takes ~11 s). Done is the group's committed offsets at each
        // partition's end, not a count of completed jobs: Tansu, read at its tail while 24 producers write,
        // now and then hands the consumer a partition's records with one left out (offsets 2013, 2015 — a fresh
        // reader afterwards gets 2014), so the dispatcher never sees that job (RELIABILITY.md).
        let committed = try KafkaConsumer(configuration: KafkaConsumerConfiguration(
            kafka: KafkaConfiguration(brokerList: harness.topics.brokers), groupID: harness.topics.group),
            logger: testLogger)
        try await eventually("the group committed every partition to its end", timeout: .seconds(90)) {
            let positions = try await committed.committed(ends.keys.map {
                KafkaTopicPartition(topic: harness.topics.jobs, partition: $0)
            })
            return positions.allSatisfy { $0.offset == ends[$0.partition] }
        }
        try await committed.close()
        let completed = harness.metric("herald_dispatcher_jobs_completed_total") ?? 0
        if completed < Double(total) {
            print("fetch stall test: \(total - Int(completed)) of \(total) jobs were never handed to the dispatcher")
        }
        // Tansu's gaps are single records now and then; more missing would be the dispatcher's own loss.
        #expect(Double(total) - completed <= 10)
        #expect((harness.metric("herald_dispatcher_fetch_stalls_total") ?? 0) >= 1)
        await harness.stop()
        await broker.crash()
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

    @Test("a consumer that replaced a stalled one and receives nothing for twice the stall timeout counts as stalled")
    func silentReplacement() {
        var watchdog = FetchWatchdog(stallTimeout: .seconds(5))
        let start = ContinuousClock.now
        #expect(!watchdog.silentSinceReplacement(now: start + .seconds(60)), "never replaced: an idle topic is no stall")
        watchdog.replaced(at: start)
        #expect(!watchdog.silentSinceReplacement(now: start + .seconds(9)))
        #expect(watchdog.silentSinceReplacement(now: start + .seconds(10)))
        watchdog.recordsArrived()
        #expect(!watchdog.silentSinceReplacement(now: start + .seconds(60)))
    }
}
