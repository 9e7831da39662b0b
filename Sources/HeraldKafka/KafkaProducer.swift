internal import CRdKafka
import HeraldRuntime
import Synchronization

/// What to do with one record's delivery report; retained while librdkafka holds the record.
final class DeliveryHandler: Sendable {
    let topic: String
    let complete: @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void

    init(topic: String, complete: @escaping @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void) {
        self.topic = topic
        self.complete = complete
    }
}

/// An idempotent Kafka producer (acks=all) whose `send` completes when the broker acknowledged the record.
///
/// Every record either gets the broker's acknowledgement or a typed error within
/// `KafkaProducerConfiguration.messageTimeout`; a full local buffer fails at once with a retriable `.queueFull`.
/// Delivery reports are served by a thread the producer owns. Call `close()` when done: it waits for queued
/// records (up to a timeout) and fails the rest, so no `send` is left waiting.
public final class KafkaProducer: Sendable {
    private let client: RDKafkaClient
    private let thread: OwnedThread
    private let state = Mutex(State())
    private let timeout: Duration

    private struct State: ~Copyable {
        var closed = false
        // Topic handles are looked up by name for each record otherwise; kept until close.
        var topics: [String: TopicHandle] = [:]
    }

    // librdkafka's topic handles are thread-safe and live until close() destroys them.
    private struct TopicHandle: @unchecked Sendable {
        let pointer: OpaquePointer
    }

    /// Creates the producer; brokers are contacted in the background (bad ones surface as send errors and logs).
    public init(configuration: KafkaProducerConfiguration, logger: Logger) throws(KafkaError) {
        try configuration.kafka.validate()
        let client = try RDKafkaClient(kind: .producer, properties: configuration.librdkafkaProperties,
                                       logger: logger, deliveryReports: true)
        self.client = client
        self.timeout = configuration.kafka.requestTimeout
        // Serves delivery reports and error callbacks; rd_kafka_yield cuts a poll short when a job arrives.
        thread = OwnedThread(name: "kafka-producer-poll", idle: { _ = rd_kafka_poll(client.handle, 100) },
                             wake: { rd_kafka_yield(client.handle) })
    }

    deinit {
        // close() was not called: fail what is still queued rather than leave senders waiting forever.
        if !state.withLock({ $0.closed }) { shutdown(flushTimeout: .zero) }
        thread.stop()
    }

    /// Sends one record and returns where the broker stored it once it acknowledged it (acks=all).
    ///
    /// Fails with `.queueFull` (retriable) when the local buffer is full, `.messageTimedOut` (retriable) when no
    /// acknowledgement came within the configured message timeout, `.destroyed` after `close()`.
    /// `partition: nil` lets the key choose the partition.
    public func send(topic: String, key: [UInt8]?, value: [UInt8], headers: [(String, [UInt8])] = [],
                     partition: Int32? = nil) async throws(KafkaError) -> KafkaDeliveryReport {
        let result: Result<KafkaDeliveryReport, KafkaError> = await withCheckedContinuation { continuation in
            do throws(KafkaError) {
                try send(topic: topic, key: key, value: value, headers: headers, partition: partition) { result in
                    continuation.resume(returning: result)
                }
            } catch {
                continuation.resume(returning: .failure(error))
            }
        }
        return try result.get()
    }

    /// Sends one record with a UTF-8 key.
    public func send(topic: String, key: String, value: [UInt8], headers: [(String, [UInt8])] = [],
                     partition: Int32? = nil) async throws(KafkaError) -> KafkaDeliveryReport {
        try await send(topic: topic, key: Array(key.utf8), value: value, headers: headers,
                       partition: partition)
    }

    /// Queues one record and calls `onDelivery` once, on the producer's thread, with the broker's answer.
    ///
    /// Throws instead of calling `onDelivery` when the record cannot even be queued (`.queueFull`, `.destroyed`,
    /// a fatal producer error). `onDelivery` must return quickly: it delays every other delivery report.
    public func send(topic: String, key: [UInt8]?, value: [UInt8], headers: [(String, [UInt8])] = [],
                     partition: Int32? = nil,
                     onDelivery: @escaping @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void)
        throws(KafkaError) {
        let pending = Unmanaged.passRetained(DeliveryHandler(topic: topic, complete: onDelivery)).toOpaque()
        let failure: KafkaError? = state.withLock { state in
            guard !state.closed else { return .closed("producer") }
            let topicHandle: OpaquePointer
            if let known = state.topics[topic] {
                topicHandle = known.pointer
            } else {
                guard let created = rd_kafka_topic_new(client.handle, topic, nil) else {
                    return KafkaError(rd_kafka_last_error(), message: "topic \(topic)")
                }
                state.topics[topic] = TopicHandle(pointer: created)
                topicHandle = created
            }
            let failure = produce(topicHandle: topicHandle, key: key, value: value, headers: headers,
                                  partition: partition ?? RD_KAFKA_PARTITION_UA, pending: pending)
            // Still under the lock: close() may destroy the handle as soon as it is released.
            if failure?.code == .fatal, let fatal = client.fatalError { return fatal }
            return failure
        }
        if let failure {
            Unmanaged<DeliveryHandler>.fromOpaque(pending).release()
            throw failure
        }
    }

    private func produce(topicHandle: OpaquePointer, key: [UInt8]?, value: [UInt8], headers: [(String, [UInt8])],
                         partition: Int32, pending: UnsafeMutableRawPointer) -> KafkaError? {
        var headerList: OpaquePointer?
        if !headers.isEmpty {
            headerList = rd_kafka_headers_new(headers.count)
            for (name, headerValue) in headers {
                _ = headerValue.withUnsafeBytes { bytes in
                    rd_kafka_header_add(headerList, name, -1, bytes.baseAddress, bytes.count)
                }
            }
        }
        let error: OpaquePointer? = value.withUnsafeBytes { valueBytes in
            withOptionalBytes(key) { keyBytes in
                withUnsafeTemporaryAllocation(of: rd_kafka_vu_t.self, capacity: 7) { fields in
                    var count = 0
                    func add(_ type: rd_kafka_vtype_t, _ fill: (inout rd_kafka_vu_t) -> Void) {
                        var field = rd_kafka_vu_t()
                        field.vtype = type
                        fill(&field)
                        fields.initializeElement(at: count, to: field)
                        count += 1
                    }
                    add(RD_KAFKA_VTYPE_RKT) { $0.u.rkt = topicHandle }
                    add(RD_KAFKA_VTYPE_PARTITION) { $0.u.i32 = partition }
                    add(RD_KAFKA_VTYPE_MSGFLAGS) { $0.u.i = RD_KAFKA_MSG_F_COPY }
                    add(RD_KAFKA_VTYPE_VALUE) {
                        $0.u.mem.ptr = UnsafeMutableRawPointer(mutating: valueBytes.baseAddress)
                        $0.u.mem.size = valueBytes.count
                    }
                    if let keyBytes {
                        add(RD_KAFKA_VTYPE_KEY) {
                            $0.u.mem.ptr = UnsafeMutableRawPointer(mutating: keyBytes.baseAddress)
                            $0.u.mem.size = keyBytes.count
                        }
                    }
                    add(RD_KAFKA_VTYPE_OPAQUE) { $0.u.ptr = pending }
                    if let headerList { add(RD_KAFKA_VTYPE_HEADERS) { $0.u.headers = headerList } }
                    defer { fields.baseAddress!.deinitialize(count: count) }
                    return rd_kafka_produceva(client.handle, fields.baseAddress, count)
                }
            }
        }
        guard let error else { return nil } // librdkafka now owns the copies and the header list
        if let headerList { rd_kafka_headers_destroy(headerList) }
        return KafkaError(consuming: error)
    }

    /// Waits until every queued record has been acknowledged or failed; `.timedOut` if some remain after `timeout`.
    public func flush(timeout: Duration) async throws(KafkaError) {
        let client = self.client
        try await thread.run { () throws(KafkaError) in
            let error = rd_kafka_flush(client.handle, timeout.timeoutMilliseconds)
            if error != RD_KAFKA_RESP_ERR_NO_ERROR {
                throw KafkaError(error, message: "\(rd_kafka_outq_len(client.handle)) records still unacknowledged")
            }
        }
    }

    /// Partition count of `topic` from the broker's metadata (also a cheap "is Kafka reachable" check).
    public func partitionCount(topic: String) async throws(KafkaError) -> Int {
        let client = self.client, timeout = self.timeout
        return try await thread.run { () throws(KafkaError) in try client.partitionCount(topic: topic, timeout: timeout) }
    }

    /// Waits up to `timeout` for queued records, fails the rest (`.purgedFromQueue` / `.purgedInFlight`), stops
    /// the producer and disconnects from the brokers. Later sends fail with `.destroyed`.
    public func close(timeout: Duration = .seconds(5)) async {
        guard !state.withLock({ state in
            defer { state.closed = true }
            return state.closed
        }) else { return }
        _ = try? await thread.run { [self] in shutdown(flushTimeout: timeout) }
        thread.stop()
        client.destroy()
    }

    private func shutdown(flushTimeout: Duration) {
        state.withLock { $0.closed = true }
        if rd_kafka_flush(client.handle, flushTimeout.timeoutMilliseconds) != RD_KAFKA_RESP_ERR_NO_ERROR {
            client.logger.warning("Kafka producer closing with unacknowledged records",
                                  ["kafka.pending": String(rd_kafka_outq_len(client.handle))])
            _ = rd_kafka_purge(client.handle, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT)
            // Serves the purged records' failure reports.
            _ = rd_kafka_flush(client.handle, 1000)
        }
        let topics = state.withLock { state in
            defer { state.topics.removeAll() }
            return state.topics.values.map(\.pointer)
        }
        for topic in topics { rd_kafka_topic_destroy(topic) }
    }
}

private func withOptionalBytes<R>(_ bytes: [UInt8]?, _ body: (UnsafeRawBufferPointer?) -> R) -> R {
    guard let bytes else { return body(nil) }
    return bytes.withUnsafeBytes { body($0) }
}
