internal import CRdKafka
import HeraldRuntime

/// Topic administration: create topics, list them with their partition counts.
public final class KafkaAdmin: Sendable {
    private let client: RDKafkaClient
    private let thread: OwnedThread
    private let timeout: Duration

    public init(configuration: KafkaConfiguration, logger: Logger) throws(KafkaError) {
        try configuration.validate()
        client = try RDKafkaClient(kind: .producer, properties: configuration.librdkafkaProperties, logger: logger)
        timeout = configuration.requestTimeout
        // Polling serves error callbacks, which would otherwise pile up in the handle's main queue.
        thread = OwnedThread(name: "kafka-admin", idle: { [client] in _ = rd_kafka_poll(client.handle, 100) },
                             wake: { [client] in rd_kafka_yield(client.handle) })
    }

    deinit { thread.stop() }

    /// Disconnects; later calls fail with `.destroyed`.
    public func close() {
        thread.stop()
        client.destroy()
    }

    /// Creates `name` with `partitions` partitions, waiting for the broker's answer (bounded by the request
    /// timeout). With `ifNotExists`, a topic that is already there counts as success (its settings are not checked).
    public func createTopic(_ name: String, partitions: Int, replicationFactor: Int = 1,
                            ifNotExists: Bool = false) async throws(KafkaError) {
        let client = self.client, timeout = self.timeout
        try await thread.run { () throws(KafkaError) in
            var errorText = [CChar](repeating: 0, count: 512)
            guard let topic = rd_kafka_NewTopic_new(name, Int32(clamping: partitions), Int32(clamping: replicationFactor),
                                                    &errorText, errorText.count) else {
                throw KafkaError(code: .invalidArgument, message: "topic \(name): \(cText(errorText))")
            }
            defer { rd_kafka_NewTopic_destroy(topic) }
            let options = rd_kafka_AdminOptions_new(client.handle, RD_KAFKA_ADMIN_OP_CREATETOPICS)
            defer { rd_kafka_AdminOptions_destroy(options) }
            _ = rd_kafka_AdminOptions_set_request_timeout(options, timeout.timeoutMilliseconds, &errorText, errorText.count)
            _ = rd_kafka_AdminOptions_set_operation_timeout(options, timeout.timeoutMilliseconds, &errorText,
                                                            errorText.count)
            guard let queue = rd_kafka_queue_new(client.handle) else {
                throw KafkaError(code: .destroyed, message: "no queue for the admin result")
            }
            defer { rd_kafka_queue_destroy(queue) }
            var topics: [OpaquePointer?] = [topic]
            rd_kafka_CreateTopics(client.handle, &topics, 1, options, queue)
            // The request timeout bounds the answer; the extra second lets librdkafka report that timeout itself.
            guard let event = rd_kafka_queue_poll(queue, timeout.timeoutMilliseconds &+ 1000) else {
                throw KafkaError(code: .timedOut, message: "no answer to creating topic \(name) within \(timeout)")
            }
            defer { rd_kafka_event_destroy(event) }
            let eventError = rd_kafka_event_error(event)
            guard eventError == RD_KAFKA_RESP_ERR_NO_ERROR else {
                throw KafkaError(eventError, message: "create topic \(name): \(String(cString: rd_kafka_event_error_string(event)))")
            }
            var count = 0
            guard let result = rd_kafka_event_CreateTopics_result(event),
                  let results = rd_kafka_CreateTopics_result_topics(result, &count) else { return }
            for index in 0..<count {
                let error = rd_kafka_topic_result_error(results[index])
                if error == RD_KAFKA_RESP_ERR_NO_ERROR || (ifNotExists && error == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
                    continue
                }
                let detail = rd_kafka_topic_result_error_string(results[index]).map { String(cString: $0) }
                throw KafkaError(error, message: "create topic \(name): \(detail ?? String(cString: rd_kafka_err2str(error)))")
            }
        }
    }

    /// Every topic the brokers know, with its partition count.
    public func listTopics() async throws(KafkaError) -> [KafkaTopicMetadata] {
        let client = self.client, timeout = self.timeout
        return try await thread.run { () throws(KafkaError) in
            try client.metadata(topic: nil, timeout: timeout).sorted { $0.name < $1.name }
        }
    }

    /// Partition count of `topic`; `.unknownTopicOrPartition` when it does not exist.
    public func partitionCount(topic: String) async throws(KafkaError) -> Int {
        let client = self.client, timeout = self.timeout
        return try await thread.run { () throws(KafkaError) in try client.partitionCount(topic: topic, timeout: timeout) }
    }
}
