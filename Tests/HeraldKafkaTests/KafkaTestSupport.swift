import Foundation
import HeraldKafka
import HeraldRuntime
import Testing

/// The Tansu broker scripts/test started; a missing variable fails the test instead of skipping it.
func testBrokers() throws -> [String] {
    let value = ProcessInfo.processInfo.environment["HERALD_TEST_KAFKA_BROKERS"] ?? ""
    try #require(!value.isEmpty, "HERALD_TEST_KAFKA_BROKERS is not set: run the tests through scripts/test")
    return KafkaConfiguration(brokerList: value).brokers
}

let testLogger = Logger(label: "kafka-test", minimumLevel: .warning)

/// A topic and group id no other test (or earlier run) uses.
func uniqueName(_ prefix: String) -> String {
    "test.\(prefix).\(UUID().uuidString.prefix(8).lowercased())"
}

func makeTopic(_ prefix: String, partitions: Int) async throws -> String {
    let admin = try KafkaAdmin(configuration: KafkaConfiguration(brokers: try testBrokers()), logger: testLogger)
    let topic = uniqueName(prefix)
    defer { admin.close() }
    try await admin.createTopic(topic, partitions: partitions)
    return topic
}

func makeProducer(messageTimeout: Duration = .seconds(10)) throws -> KafkaProducer {
    try KafkaProducer(configuration: KafkaProducerConfiguration(kafka: KafkaConfiguration(brokers: try testBrokers()),
                                                               messageTimeout: messageTimeout),
                      logger: testLogger)
}

/// Tansu-friendly group settings (joins take session.timeout/2; see platform notes).
func makeConsumer(group: String?, onRebalance: (@Sendable (KafkaRebalanceEvent) -> Void)? = nil) throws -> KafkaConsumer {
    var handler: KafkaRebalanceHandler?
    if let onRebalance {
        handler = { event in
            onRebalance(event)
            return []
        }
    }
    return try KafkaConsumer(configuration: KafkaConsumerConfiguration(kafka: KafkaConfiguration(brokers: try testBrokers()),
                                                               groupID: group, sessionTimeout: .seconds(6),
                                                               heartbeatInterval: .milliseconds(500)),
                      logger: testLogger, onRebalance: handler)
}

/// Polls until `done` says enough arrived or `deadline` passes; returns everything read.
func pollUntil(_ consumer: KafkaConsumer, deadline: Duration = .seconds(30),
               commitEachBatch: Bool = false, done: ([KafkaRecord]) -> Bool) async throws -> [KafkaRecord] {
    let clock = ContinuousClock()
    let end = clock.now + deadline
    var records: [KafkaRecord] = []
    while !done(records), clock.now < end {
        let batch = try await consumer.poll(maxRecords: 1000, timeout: .milliseconds(200))
        records += batch
        if commitEachBatch, !batch.isEmpty {
            // The highest offset per partition in this batch.
            var latest: [KafkaTopicPartition: KafkaTopicPartitionOffset] = [:]
            for record in batch { latest[KafkaTopicPartition(topic: record.topic, partition: record.partition)] = record.offsetToCommit }
            try await consumer.commit(Array(latest.values))
        }
    }
    return records
}

/// Collects values from callbacks running on other threads.
final class Collector<Value: Sendable>: Sendable {
    private let values = Lock<[Value]>([])
    func append(_ value: Value) { values.withLock { $0.append(value) } }
    var all: [Value] { values.withLock { $0 } }
}
