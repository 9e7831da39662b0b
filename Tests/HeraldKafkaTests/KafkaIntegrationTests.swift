import Foundation
import HeraldKafka
import HeraldTestSupport
import Testing

@Suite("Kafka client against Tansu")
struct KafkaIntegrationTests {
    @Test func tenThousandRecordsArriveIntactThroughAGroup() async throws {
        let topic = try await makeTopic("roundtrip", partitions: 4)
        let producer = try makeProducer()
        let count = 10_000
        let reports = try await withThrowingTaskGroup(of: KafkaDeliveryReport.self) { group in
            for index in 0..<count {
                group.addTask {
                    try await producer.send(topic: topic, key: "key-\(index)", value: Array("value-\(index)".utf8),
                                            headers: [("index", Array("\(index)".utf8)), ("bytes", [0, 1, 255])])
                }
            }
            return try await group.reduce(into: [KafkaDeliveryReport]()) { $0.append($1) }
        }
        #expect(reports.count == count)
        #expect(Set(reports.map { "\($0.partition)/\($0.offset)" }).count == count, "every record has its own place")
        await producer.close()

        let consumer = try makeConsumer(group: uniqueName("roundtrip"))
        try await consumer.subscribe(topics: [topic])
        let records = try await pollUntil(consumer, deadline: .seconds(60), commitEachBatch: true) { $0.count >= count }
        try await consumer.close()

        #expect(records.count == count)
        var seen = Set<Int>()
        for record in records {
            let index = try #require(Int(String(decoding: record.value, as: UTF8.self).dropFirst("value-".count)))
            seen.insert(index)
            #expect(record.topic == topic)
            #expect(record.key == Array("key-\(index)".utf8))
            #expect(record.headers.map(\.name) == ["index", "bytes"])
            #expect(record.headers.first?.value == Array("\(index)".utf8))
            #expect(record.headers.last?.value == [0, 1, 255])
            #expect(record.timestamp != nil)
        }
        #expect(seen == Set(0..<count))
    }

    @Test func aReopenedMemberResumesAtTheCommittedOffset() async throws {
        let topic = try await makeTopic("resume", partitions: 1)
        let producer = try makeProducer()
        for index in 0..<100 {
            _ = try await producer.send(topic: topic, key: nil, value: Array("\(index)".utf8))
        }
        await producer.close()
        let group = uniqueName("resume")

        let first = try makeConsumer(group: group)
        try await first.subscribe(topics: [topic])
        let read = try await pollUntil(first) { $0.count >= 40 }
        try #require(read.count >= 40)
        #expect(read.prefix(40).map(\.offset) == Array(0..<40))
        try await first.commit([read[39].offsetToCommit])
        let committed = try await first.committed([KafkaTopicPartition(topic: topic, partition: 0)])
        #expect(committed.map(\.offset) == [40])
        try await first.close()

        let second = try makeConsumer(group: group)
        try await second.subscribe(topics: [topic])
        let rest = try await pollUntil(second) { $0.count >= 60 }
        try await second.close()
        do {
            _ = try await second.poll(timeout: .milliseconds(10))
            Issue.record("a closed consumer reads nothing")
        } catch {
            #expect(error.code == .destroyed)
        }
        #expect(rest.map(\.offset) == Array(40..<100), "no loss, and nothing committed comes again")
        #expect(rest.map { String(decoding: $0.value, as: UTF8.self) } == (40..<100).map { "\($0)" })
    }

    @Test func offsetsForTimesFindTheFirstLaterRecordForAReplay() async throws {
        let topic = try await makeTopic("times", partitions: 1)
        let producer = try makeProducer()
        for index in 0..<5 {
            _ = try await producer.send(topic: topic, key: "early", value: Array("early-\(index)".utf8), partition: 0)
        }
        try await Task.sleep(for: .milliseconds(50))
        let cut = Date()
        try await Task.sleep(for: .milliseconds(50))
        for index in 0..<5 {
            _ = try await producer.send(topic: topic, key: "late", value: Array("late-\(index)".utf8), partition: 0)
        }
        await producer.close()

        let reader = try makeConsumer(group: nil)
        #expect(try await reader.partitionCount(topic: topic) == 1)
        let starts = try await reader.offsets(forTimestamp: cut, topic: topic)
        #expect(starts == [KafkaTopicPartitionOffset(topic: topic, partition: 0, offset: 5)])

        try await reader.assign(starts)
        let replay = try await pollUntil(reader) { $0.count >= 5 }
        try await reader.close()
        #expect(replay.map { String(decoding: $0.value, as: UTF8.self) } == (0..<5).map { "late-\($0)" })
    }

    @Test func rebalanceHandlerHearsAssignmentAndRevocation() async throws {
        let topic = try await makeTopic("rebalance", partitions: 3)
        let events = Collector<KafkaRebalanceEvent>()
        let consumer = try makeConsumer(group: uniqueName("rebalance")) { events.append($0) }
        try await consumer.subscribe(topics: [topic])
        let expected = (0..<3).map { KafkaTopicPartition(topic: topic, partition: Int32($0)) }
        _ = try await pollUntil(consumer) { _ in !events.all.isEmpty }
        try await consumer.close()
        let all = events.all
        guard case .assigned(let assigned)? = all.first else {
            Issue.record("first event should be an assignment, got \(all)")
            return
        }
        #expect(Set(assigned) == Set(expected))
        #expect(all.last == .revoked(assigned), "closing gives the partitions back")
    }

    /// librdkafka keeps a pause the application asked for across a revocation; the member that gets the partition
    /// again knows nothing of it (the dispatcher forgets a revoked partition), so it must come back unpaused.
    @Test func aPausedPartitionAssignedAgainIsFetched() async throws {
        let topic = try await makeTopic("paused", partitions: 2)
        let group = uniqueName("paused")
        let events = Collector<KafkaRebalanceEvent>()
        let first = try makeConsumer(group: group) { events.append($0) }
        try await first.subscribe(topics: [topic])
        @Sendable func holdsBoth() -> Bool {
            if case .assigned(let partitions)? = events.all.last { return partitions.count == 2 }
            return false
        }
        _ = try await pollUntil(first) { _ in holdsBoth() }
        try #require(holdsBoth())
        try await first.pause([KafkaTopicPartition(topic: topic, partition: 0)])
        // A second member joins (the partitions are shared out again), then leaves (both come back to the first).
        let second = try makeConsumer(group: group)
        try await second.subscribe(topics: [topic])
        let seen = events.all.count
        async let joined = pollUntil(second, deadline: .seconds(20)) { _ in events.all.count >= seen + 2 }
        _ = try await pollUntil(first, deadline: .seconds(20)) { _ in events.all.count >= seen + 2 }
        _ = try await joined
        try await second.close()
        _ = try await pollUntil(first) { _ in events.all.count > seen + 2 && holdsBoth() }
        try #require(holdsBoth(), "\(events.all)")
        let producer = try makeProducer()
        _ = try await producer.send(topic: topic, key: nil, value: Array("after".utf8), partition: 0)
        await producer.close()
        let read = try await pollUntil(first, deadline: .seconds(20)) { !$0.isEmpty }
        try await first.close()
        #expect(read.map(\.partition) == [0], "the paused partition, assigned again, is fetched")
    }

    @Test func adminCreatesListsAndToleratesExistingTopics() async throws {
        let admin = try KafkaAdmin(configuration: KafkaConfiguration(brokers: try testBrokers()), logger: testLogger)
        let topic = uniqueName("admin")
        try await admin.createTopic(topic, partitions: 3)
        let listed = try await admin.listTopics()
        #expect(listed.contains(KafkaTopicMetadata(name: topic, partitionCount: 3)))
        #expect(try await admin.partitionCount(topic: topic) == 3)
        do {
            try await admin.createTopic(topic, partitions: 3)
            Issue.record("the topic exists already")
        } catch {
            #expect(error.code == .topicAlreadyExists)
        }
        try await admin.createTopic(topic, partitions: 3, ifNotExists: true)
        do {
            _ = try await admin.partitionCount(topic: uniqueName("missing"))
            Issue.record("a missing topic has no partition count")
        } catch {
            #expect(error.code == .unknownTopicOrPartition)
        }
        admin.close()
        do {
            _ = try await admin.listTopics()
            Issue.record("a closed admin client makes no requests")
        } catch {
            #expect(error.code == .destroyed)
        }
    }
}

@Suite("Kafka producer without a broker")
struct KafkaProducerFailureTests {
    /// A loopback port nothing listens on: bound, then closed again.
    private func closedPort() throws -> Int { Int(try freePort()) }

    private func deadProducer(maxBufferedMessages: Int = 100_000) throws -> KafkaProducer {
        let kafka = KafkaConfiguration(brokers: ["127.0.0.1:\(try closedPort())"])
        return try KafkaProducer(configuration: KafkaProducerConfiguration(kafka: kafka, messageTimeout: .seconds(1),
                                                                           maxBufferedMessages: maxBufferedMessages),
                                 logger: testLogger)
    }

    @Test func sendFailsWithATypedErrorWithinTheMessageTimeout() async throws {
        let producer = try deadProducer()
        let clock = ContinuousClock()
        let start = clock.now
        do {
            _ = try await producer.send(topic: "herald.jobs", key: "k", value: [1, 2, 3])
            Issue.record("a send with no broker must fail")
        } catch {
            #expect(error.code == .messageTimedOut)
            #expect(error.isRetriable)
        }
        // The 1 s message timeout, librdkafka's once-a-second timeout scan, and slack for a busy machine.
        #expect(clock.now - start < .seconds(4))
        await producer.close(timeout: .zero)
    }

    /// A producer whose last reference goes with a delivery report's closure is released inside `rd_kafka_poll`
    /// on its own poll thread: it must still fail what it holds and destroy its handle, from another thread.
    @Test func aProducerReleasedByItsOwnDeliveryReportIsRetired() async throws {
        let outcomes = Collector<Result<KafkaDeliveryReport, KafkaError>>()
        let retired = Collector<Bool>()
        do {
            let producer = try deadProducer()
            try producer.send(topic: "herald.jobs", key: nil, value: [0]) { [producer] result in
                outcomes.append(result)
                withExtendedLifetime(producer) {}
            }
            try producer.send(topic: "herald.jobs", key: nil, value: [1]) { result in
                outcomes.append(result)
                retired.append(true)
            }
        }
        let clock = ContinuousClock()
        let end = clock.now + .seconds(10)
        while retired.all.isEmpty, clock.now < end { try await Task.sleep(for: .milliseconds(50)) }
        #expect(outcomes.all.count == 2, "both records got their answer")
        #expect(retired.all == [true])
    }

    @Test func aFullQueueFailsAtOnceAndCloseFailsWhatIsLeft() async throws {
        let producer = try deadProducer(maxBufferedMessages: 5)
        let outcomes = Collector<Result<KafkaDeliveryReport, KafkaError>>()
        for _ in 0..<5 {
            try producer.send(topic: "herald.jobs", key: nil, value: [0]) { outcomes.append($0) }
        }
        do {
            try producer.send(topic: "herald.jobs", key: nil, value: [0]) { _ in }
            Issue.record("the sixth record does not fit")
        } catch {
            #expect(error.code == .queueFull)
            #expect(error.isRetriable)
        }
        await producer.close(timeout: .zero)
        #expect(outcomes.all.count == 5, "every queued record got its answer")
        for outcome in outcomes.all {
            guard case .failure(let error) = outcome else {
                Issue.record("nothing can be delivered")
                continue
            }
            #expect(error.isRetriable)
        }
        do {
            _ = try await producer.send(topic: "herald.jobs", key: nil, value: [0])
            Issue.record("a closed producer sends nothing")
        } catch {
            #expect(error.code == .destroyed)
        }
    }
}
