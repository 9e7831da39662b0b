internal import CRdKafka
import Foundation
import HeraldRuntime

/// What to do with one record's delivery report; retained while librdkafka holds the record.
final class DeliveryHandler: Sendable {
    let topic: String
    let complete: @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void

    init(topic: String, complete: @escaping @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void) {
        self.topic = topic
        self.complete = complete
    }
}

/// One librdkafka producer handle, the thread serving its delivery reports and one for metadata requests.
/// `KafkaProducer` replaces it whole when it stops making progress.
final class ProducerInstance: Sendable {
    let client: RDKafkaClient
    let thread: OwnedThread
    /// Metadata requests block for up to their timeout (a gone broker): never on the delivery-report thread.
    let metadataThread: OwnedThread
    /// Counts instances, so a late delivery report cannot retire the instance that replaced its own.
    let generation: Int

    init(properties: [String: String], logger: Logger, generation: Int) throws(KafkaError) {
        let client = try RDKafkaClient(kind: .producer, properties: properties, logger: logger, deliveryReports: true)
        self.client = client
        self.generation = generation
        // Started once the handle exists: a thread started before a failing `RDKafkaClient` would wait for ever.
        metadataThread = OwnedThread(name: "kafka-metadata")
        // Serves delivery reports and error callbacks; rd_kafka_yield cuts a poll short when a job arrives.
        thread = OwnedThread(name: "kafka-poll", idle: { _ = rd_kafka_poll(client.handle, 100) },
                             wake: { rd_kafka_yield(client.handle) })
    }
}

/// An idempotent Kafka producer (acks=all) whose `send` completes when the broker acknowledged the record.
///
/// Every record either gets the broker's acknowledgement or a typed error within
/// `KafkaProducerConfiguration.messageTimeout`; a full local buffer fails at once with a retriable `.queueFull`.
/// Delivery reports are served by a thread the producer owns. Call `close()` when done: it waits for queued
/// records (up to a timeout) and fails the rest, so no `send` is left waiting.
///
/// The producer heals itself: after a fatal error, or when a record times out although the broker answers a
/// metadata request (a broker that restarted without its state answers every produce with UNKNOWN_PRODUCER_ID,
/// and librdkafka's idempotent producer then retries with a locally bumped epoch forever), the librdkafka
/// handle is replaced by a fresh one with a new producer id. Records still queued in the old handle fail
/// (`.purgedFromQueue` / `.purgedInFlight`); nothing is reported delivered that the broker did not acknowledge.
public final class KafkaProducer: Sendable {
    private let state: Lock<State>
    private let properties: [String: String]
    private let logger: Logger
    private let timeout: Duration
    /// How long a stalled handle is probed before it is replaced, and the least time between replacements.
    private let probeTimeout: Duration
    private let replacements = MetricsRegistry.shared.counter(
        "herald_kafka_producer_replacements_total",
        help: "librdkafka producer handles replaced after a fatal error or a stall against a reachable broker.")

    private struct State: ~Copyable {
        var closed = false
        var instance: ProducerInstance
        // Topic handles of `instance`, looked up by name for each record otherwise; kept until it is retired.
        var topics: [String: TopicHandle] = [:]
        /// Set while a stall is being probed or a replacement is under way, so one happens at a time.
        var recovering = false
        /// Set while a replacement handle is being built.
        var replacing = false
        var lastReplacement: ContinuousClock.Instant?
    }

    // librdkafka's topic handles are thread-safe and live until their instance is retired.
    private struct TopicHandle: @unchecked Sendable {
        let pointer: OpaquePointer
    }

    /// Creates the producer; brokers are contacted in the background (bad ones surface as send errors and logs).
    public init(configuration: KafkaProducerConfiguration, logger: Logger) throws(KafkaError) {
        try configuration.kafka.validate()
        properties = configuration.librdkafkaProperties
        self.logger = logger
        timeout = configuration.kafka.requestTimeout
        probeTimeout = min(configuration.kafka.requestTimeout, max(configuration.messageTimeout, .seconds(1)))
        state = Lock(State(instance: try ProducerInstance(properties: properties, logger: logger, generation: 0)))
    }

    deinit {
        // close() was not called: fail what is still queued rather than leave senders waiting forever.
        let open: (ProducerInstance, [TopicHandle])? = state.withLock { state in
            guard !state.closed else { return nil } // close() retired it
            state.closed = true
            return (state.instance, Array(state.topics.values))
        }
        guard let (instance, topics) = open else { return }
        // Released by a delivery report's closure, inside rd_kafka_poll: destroying the handle there frees what
        // the poll still uses. Retire it from a thread of its own once the poll has returned.
        if instance.thread.isCurrent {
            let logger = logger
            Thread.detachNewThread { Self.retire(instance, topics: topics, flushTimeout: .zero, logger: logger) }
        } else {
            Self.retire(instance, topics: topics, flushTimeout: .zero, logger: logger)
        }
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
    /// a fatal producer error, after which the next send goes to a fresh handle). `onDelivery` must return
    /// quickly: it delays every other delivery report.
    public func send(topic: String, key: [UInt8]?, value: [UInt8], headers: [(String, [UInt8])] = [],
                     partition: Int32? = nil,
                     onDelivery: @escaping @Sendable (Result<KafkaDeliveryReport, KafkaError>) -> Void)
        throws(KafkaError) {
        let outcome: (failure: KafkaError?, instance: ProducerInstance?) = state.withLock { state in
            guard !state.closed else { return (.closed("producer"), nil) }
            let instance = state.instance
            let topicHandle: OpaquePointer
            if let known = state.topics[topic] {
                topicHandle = known.pointer
            } else {
                guard let created = rd_kafka_topic_new(instance.client.handle, topic, nil) else {
                    return (KafkaError(rd_kafka_last_error(), message: "topic \(topic)"), instance)
                }
                state.topics[topic] = TopicHandle(pointer: created)
                topicHandle = created
            }
            let generation = instance.generation
            let handler = DeliveryHandler(topic: topic) { [weak self] result in
                if case .failure(let error) = result, error.code == .messageTimedOut {
                    self?.deliveryTimedOut(generation: generation, topic: topic)
                }
                onDelivery(result)
            }
            let pending = Unmanaged.passRetained(handler).toOpaque()
            var failure = produce(client: instance.client, topicHandle: topicHandle, key: key, value: value,
                                  headers: headers, partition: partition ?? RD_KAFKA_PARTITION_UA, pending: pending)
            if failure != nil { Unmanaged<DeliveryHandler>.fromOpaque(pending).release() }
            // Still under the lock: a replacement may retire the handle as soon as it is released.
            if failure?.code == .fatal, let fatal = instance.client.fatalError { failure = fatal }
            return (failure, instance)
        }
        guard let failure = outcome.failure else { return }
        if failure.isFatal, let instance = outcome.instance {
            logger.error("Kafka producer raised a fatal error; replacing it", ["kafka.error": failure.description])
            replace(instance)
        }
        throw failure
    }

    /// A record of `generation` timed out: if the broker still answers, this handle is wedged; replace it.
    private func deliveryTimedOut(generation: Int, topic: String) {
        let probeTimeout = self.probeTimeout
        let probe: ProducerInstance? = state.withLock { state in
            let now = ContinuousClock.now
            guard !state.closed, !state.recovering, state.instance.generation == generation,
                  state.lastReplacement.map({ now - $0 >= probeTimeout }) ?? true else { return nil }
            state.recovering = true
            return state.instance
        }
        guard let probe else { return }
        // A job for the poll thread (this runs inside one of its delivery reports): retiring the handle stops
        // that thread first, so the probe never races the handle's destruction.
        let queued = probe.thread.submit { [weak self] in
            let reachable = (try? probe.client.partitionCount(topic: topic, timeout: probeTimeout)) != nil
            guard let self else { return }
            if reachable {
                logger.warning("Kafka producer stalled although the broker answers; replacing it",
                               ["kafka.topic": topic, "kafka.generation": String(generation)])
                replace(probe)
            } else {
                state.withLock { $0.recovering = false }
            }
        }
        if !queued { state.withLock { $0.recovering = false } }
    }

    /// The current handle and how many replaced it (for tests).
    var currentHandle: (handle: OpaquePointer, generation: Int) {
        let instance = state.withLock { $0.instance }
        return (instance.client.handle, instance.generation)
    }

    /// The configuration librdkafka runs the current handle with (for tests: what reached it).
    var effectiveProperties: [String: String] { state.withLock { $0.instance }.client.effectiveProperties }

    /// Swaps in a fresh handle (unless `stale` was replaced already) and retires `stale` in the background.
    private func replace(_ stale: ProducerInstance) {
        // Every send refused by a fatal handle asks for a replacement: one builds it, the others leave it at that.
        let building = state.withLock { state -> Bool in
            guard !state.closed, state.instance === stale, !state.replacing else {
                state.recovering = false // a stall probe's replacement is done or under way
                return false
            }
            state.replacing = true
            return true
        }
        guard building else { return }
        defer { state.withLock { $0.replacing = false } }
        let fresh: ProducerInstance
        do {
            fresh = try ProducerInstance(properties: properties, logger: logger, generation: stale.generation + 1)
        } catch {
            logger.error("Kafka producer could not be recreated", ["kafka.error": error.description])
            state.withLock { $0.recovering = false }
            return
        }
        let retired: (ProducerInstance, [TopicHandle])? = state.withLock { state in
            defer { state.recovering = false }
            guard !state.closed, state.instance === stale else { return nil }
            let topics = Array(state.topics.values)
            state.instance = fresh
            state.topics = [:]
            state.lastReplacement = .now
            return (stale, topics)
        }
        guard let (old, topics) = retired else {
            Self.retire(fresh, topics: [], flushTimeout: .zero, logger: logger)
            return
        }
        replacements.increment()
        let logger = self.logger
        Thread.detachNewThread { Self.retire(old, topics: topics, flushTimeout: .zero, logger: logger) }
    }

    private func produce(client: RDKafkaClient, topicHandle: OpaquePointer, key: [UInt8]?, value: [UInt8], headers: [(String, [UInt8])],
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
        let instance = try current(), client = instance.client
        try await instance.thread.run { () throws(KafkaError) in
            let error = rd_kafka_flush(client.handle, timeout.timeoutMilliseconds)
            if error != RD_KAFKA_RESP_ERR_NO_ERROR {
                throw KafkaError(error, message: "\(rd_kafka_outq_len(client.handle)) records still unacknowledged")
            }
        }
    }

    /// Partition count of `topic` from the broker's metadata (also a cheap "is Kafka reachable" check), waiting
    /// at most `timeout` (default: the configuration's request timeout), on a thread of its own: delivery reports
    /// go on meanwhile.
    public func partitionCount(topic: String, timeout: Duration? = nil) async throws(KafkaError) -> Int {
        let instance = try current(), client = instance.client, timeout = timeout ?? self.timeout
        return try await instance.metadataThread.run { () throws(KafkaError) in
            try client.partitionCount(topic: topic, timeout: timeout)
        }
    }

    /// Waits up to `timeout` for queued records, fails the rest (`.purgedFromQueue` / `.purgedInFlight`), stops
    /// the producer and disconnects from the brokers. Later sends fail with `.destroyed`.
    public func close(timeout: Duration = .seconds(5)) async {
        guard let (instance, topics) = state.withLock({ state -> (ProducerInstance, [TopicHandle])? in
            guard !state.closed else { return nil }
            state.closed = true
            defer { state.topics.removeAll() }
            return (state.instance, Array(state.topics.values))
        }) else { return }
        let logger = self.logger
        _ = try? await onOwnThread {
            Self.retire(instance, topics: topics, flushTimeout: timeout, logger: logger)
        }
    }

    private func current() throws(KafkaError) -> ProducerInstance {
        try state.withLock { state throws(KafkaError) in
            guard !state.closed else { throw .closed("producer") }
            return state.instance
        }
    }

    /// Flushes `instance` for up to `flushTimeout`, fails what remains, and destroys it. Blocks: call it off
    /// Swift's cooperative pool, once no new record can reach the instance.
    private static func retire(_ instance: ProducerInstance, topics: [TopicHandle], flushTimeout: Duration,
                               logger: Logger) {
        let client = instance.client
        // From here on the flushes below serve the delivery reports, on this thread only.
        instance.thread.stop()
        instance.metadataThread.stop()
        if rd_kafka_flush(client.handle, flushTimeout.timeoutMilliseconds) != RD_KAFKA_RESP_ERR_NO_ERROR {
            logger.warning("Kafka producer closing with unacknowledged records",
                           ["kafka.pending": String(rd_kafka_outq_len(client.handle))])
            _ = rd_kafka_purge(client.handle, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT)
            // Serves the purged records' failure reports.
            _ = rd_kafka_flush(client.handle, 1000)
        }
        for topic in topics { rd_kafka_topic_destroy(topic.pointer) }
        client.destroy()
    }
}

/// Runs one blocking call on a thread of its own: neither the poll thread nor Swift's cooperative pool.
private func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () throws(KafkaError) -> T) async throws(KafkaError) -> T {
    let result: Result<T, KafkaError> = await withCheckedContinuation { continuation in
        Thread.detachNewThread { continuation.resume(returning: Result { () throws(KafkaError) -> T in try body() }) }
    }
    return try result.get()
}

private func withOptionalBytes<R>(_ bytes: [UInt8]?, _ body: (UnsafeRawBufferPointer?) -> R) -> R {
    guard let bytes else { return body(nil) }
    return bytes.withUnsafeBytes { body($0) }
}
