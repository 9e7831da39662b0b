internal import CRdKafka
import Foundation
import HeraldRuntime
import Synchronization

/// What librdkafka's callbacks need, reached through the handle's opaque pointer.
final class RDKafkaCallbackContext: Sendable {
    let logger: Logger
    let onRebalance: KafkaRebalanceHandler?
    /// Held while a commit's positions are read and the commit is queued (`rdkafkaQueueCommit`), by the consumer's
    /// own commits and by the one before a revocation: librdkafka sends commits in the order they were queued, so an
    /// older position is not sent after a newer one (one it retries after an error may still land later).
    let commitOrder = Lock(())
    /// When each error text was last logged: librdkafka reports "all brokers are down" on every failed reconnect
    /// (every 50–100 ms against a broker that refuses the TLS handshake), which would flood the log.
    private let lastLogged = Lock<[String: ContinuousClock.Instant]>([:])
    static let repeatInterval = Duration.seconds(30)

    init(logger: Logger, onRebalance: KafkaRebalanceHandler?) {
        self.logger = logger
        self.onRebalance = onRebalance
    }

    /// True when `text` was not logged in the last `repeatInterval`.
    func isNew(_ text: String) -> Bool {
        let now = ContinuousClock.now
        return lastLogged.withLock { seen in
            if let last = seen[text], now - last < Self.repeatInterval { return false }
            if seen.count > 256 { seen.removeAll() }
            seen[text] = now
            return true
        }
    }
}

/// Owns one `rd_kafka_t` handle and the callback context it points to; destroys both in `deinit`.
///
/// Every C call of the wrapper goes through this folder. librdkafka's handle is thread-safe for all the calls
/// made here; the wrapper only keeps blocking ones off Swift's cooperative pool.
final class RDKafkaClient: @unchecked Sendable { // immutable after init; librdkafka synchronises the handle
    enum Kind { case producer, consumer }

    let handle: OpaquePointer
    let logger: Logger
    /// The consumer queue, for consumers (destroyed before the handle).
    let consumerQueue: OpaquePointer?
    private let context: Unmanaged<RDKafkaCallbackContext>
    private let destroyed = Atomic(false)

    /// See `RDKafkaCallbackContext.commitOrder`.
    var commitOrder: Lock<Void> { context.takeUnretainedValue().commitOrder }

    init(kind: Kind, properties: [String: String], logger: Logger, deliveryReports: Bool = false,
         onRebalance: KafkaRebalanceHandler? = nil) throws(KafkaError) {
        let conf = rd_kafka_conf_new()!
        var errorText = [CChar](repeating: 0, count: 512)
        // Sorted so a bad property is reported the same way every time.
        for (key, value) in properties.sorted(by: { $0.key < $1.key }) {
            let result = rd_kafka_conf_set(conf, key, value, &errorText, errorText.count)
            guard result == RD_KAFKA_CONF_OK else {
                rd_kafka_conf_destroy(conf)
                throw KafkaError(code: .invalidArgument,
                                 message: "Kafka property \(key): \(cText(errorText))")
            }
        }
        // With a log callback librdkafka never prints to stderr itself: every line becomes one JSON log line.
        rd_kafka_conf_set_log_cb(conf, rdkafkaLog)
        rd_kafka_conf_set_error_cb(conf, rdkafkaError)
        if deliveryReports { rd_kafka_conf_set_dr_msg_cb(conf, rdkafkaDeliveryReport) }
        if onRebalance != nil { rd_kafka_conf_set_rebalance_cb(conf, rdkafkaRebalance) }
        let context = Unmanaged.passRetained(RDKafkaCallbackContext(logger: logger, onRebalance: onRebalance))
        rd_kafka_conf_set_opaque(conf, context.toOpaque())

        let type = kind == .producer ? RD_KAFKA_PRODUCER : RD_KAFKA_CONSUMER
        guard let handle = rd_kafka_new(type, conf, &errorText, errorText.count) else {
            rd_kafka_conf_destroy(conf) // only taken over on success
            context.release()
            throw KafkaError(code: .invalidArgument, message: "Kafka client: \(cText(errorText))")
        }
        self.handle = handle
        self.context = context
        self.logger = logger
        if kind == .consumer {
            // Errors and logs then come through the consumer's poll, and batches read from one queue.
            rd_kafka_poll_set_consumer(handle)
            consumerQueue = rd_kafka_queue_get_consumer(handle)
        } else {
            consumerQueue = nil
        }
    }

    deinit { destroy() }

    /// Whether `destroy` has run: the handle must not be used.
    var isDestroyed: Bool { destroyed.load(ordering: .acquiring) }

    /// Destroys the handle (once). The owner calls it only when no other thread can use the handle any more: new
    /// calls are refused, and those already queued on the thread that destroys it check `isDestroyed` first.
    func destroy() {
        guard !destroyed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        if let consumerQueue { rd_kafka_queue_destroy(consumerQueue) }
        rd_kafka_destroy(handle)
        // Only now can no callback run any more.
        context.release()
    }

    /// The configuration librdkafka runs with, as it reports it (its own defaults included; secrets it redacts).
    var effectiveProperties: [String: String] {
        var count = 0
        guard let dump = rd_kafka_conf_dump(rd_kafka_conf(handle), &count) else { return [:] }
        defer { rd_kafka_conf_dump_free(dump, count) }
        var properties: [String: String] = [:]
        for index in stride(from: 0, to: count - 1, by: 2) {
            guard let name = dump[index] else { continue }
            properties[String(cString: name)] = dump[index + 1].map { String(cString: $0) } ?? ""
        }
        return properties
    }

    /// The underlying error when the client raised a fatal one.
    var fatalError: KafkaError? {
        var text = [CChar](repeating: 0, count: 512)
        let code = rd_kafka_fatal_error(handle, &text, text.count)
        guard code != RD_KAFKA_RESP_ERR_NO_ERROR else { return nil }
        return KafkaError(code: .fatal, message: "\(String(cString: rd_kafka_err2name(code))): \(cText(text))",
                          isRetriable: false, isFatal: true)
    }

    /// Topic metadata from the broker: all topics, or one (which must exist). Blocks up to `timeout`.
    func metadata(topic: String?, timeout: Duration) throws(KafkaError) -> [KafkaTopicMetadata] {
        var topicHandle: OpaquePointer?
        if let topic {
            topicHandle = rd_kafka_topic_new(handle, topic, nil)
            guard topicHandle != nil else { throw KafkaError(rd_kafka_last_error(), message: "topic \(topic)") }
        }
        defer { if let topicHandle { rd_kafka_topic_destroy(topicHandle) } }
        var metadata: UnsafePointer<rd_kafka_metadata>?
        let error = rd_kafka_metadata(handle, topic == nil ? 1 : 0, topicHandle, &metadata, timeout.timeoutMilliseconds)
        guard error == RD_KAFKA_RESP_ERR_NO_ERROR, let metadata else {
            throw KafkaError(error, message: "metadata request failed: \(String(cString: rd_kafka_err2str(error)))")
        }
        defer { rd_kafka_metadata_destroy(metadata) }
        var topics: [KafkaTopicMetadata] = []
        for index in 0..<Int(metadata.pointee.topic_cnt) {
            let entry = metadata.pointee.topics[index]
            let name = String(cString: entry.topic)
            if entry.err != RD_KAFKA_RESP_ERR_NO_ERROR {
                // Listing all topics skips broken ones; asking for one topic reports why it is missing.
                if topic != nil { throw KafkaError(entry.err, message: "topic \(name): \(String(cString: rd_kafka_err2str(entry.err)))") }
                continue
            }
            topics.append(KafkaTopicMetadata(name: name, partitionCount: Int(entry.partition_cnt)))
        }
        return topics
    }

    func partitionCount(topic: String, timeout: Duration) throws(KafkaError) -> Int {
        guard let entry = try metadata(topic: topic, timeout: timeout).first(where: { $0.name == topic }),
              entry.partitionCount > 0 else {
            throw KafkaError(code: .unknownTopicOrPartition, message: "topic \(topic) has no partitions")
        }
        return entry.partitionCount
    }
}

// MARK: - Callbacks (capture-less; context comes from the handle's opaque pointer)

private func rdkafkaLog(_ handle: OpaquePointer?, _ level: Int32, _ facility: UnsafePointer<CChar>?,
                        _ line: UnsafePointer<CChar>?) {
    guard let handle, let opaque = rd_kafka_opaque(handle) else { return }
    let context = Unmanaged<RDKafkaCallbackContext>.fromOpaque(opaque).takeUnretainedValue()
    // A broker failure comes as a FAIL log line and as an error callback with the same text; the error callback
    // (which repeats each text at most every 30 s) is the one line it gets.
    if let facility, strcmp(facility, "FAIL") == 0 { return }
    // syslog levels: 0–3 emergency…error, 4 warning, 5–6 notice/info, 7 debug.
    let mapped: Logger.Level = level <= 3 ? .error : level == 4 ? .warning : level <= 6 ? .info : .debug
    context.logger.log(mapped, line.map { String(cString: $0) } ?? "", [
        "kafka.facility": facility.map { String(cString: $0) } ?? "",
        "kafka.client": String(cString: rd_kafka_name(handle)),
    ])
}

private func rdkafkaError(_ handle: OpaquePointer?, _ code: Int32, _ reason: UnsafePointer<CChar>?,
                          _ opaque: UnsafeMutableRawPointer?) {
    guard let handle, let opaque else { return }
    let context = Unmanaged<RDKafkaCallbackContext>.fromOpaque(opaque).takeUnretainedValue()
    let error = rd_kafka_resp_err_t(rawValue: code)
    var fields = ["kafka.error": String(cString: rd_kafka_err2name(error)),
                  "kafka.client": String(cString: rd_kafka_name(handle))]
    var level = Logger.Level.warning
    if error == RD_KAFKA_RESP_ERR__FATAL {
        level = .error
        var text = [CChar](repeating: 0, count: 512)
        let underlying = rd_kafka_fatal_error(handle, &text, text.count)
        fields["kafka.fatal"] = "\(String(cString: rd_kafka_err2name(underlying))): \(cText(text))"
    } else if error == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN {
        level = .error
    }
    let text = reason.map { String(cString: $0) } ?? "Kafka client error"
    guard context.isNew(fields["kafka.error", default: ""] + text) else { return }
    context.logger.log(level, text, fields)
}

private func rdkafkaDeliveryReport(_ handle: OpaquePointer?, _ message: UnsafePointer<rd_kafka_message_t>?,
                                   _ opaque: UnsafeMutableRawPointer?) {
    guard let message, let pending = message.pointee._private else { return }
    // The producer retained the handler when it queued the record; this is its one and only report.
    let handler = Unmanaged<DeliveryHandler>.fromOpaque(pending).takeRetainedValue()
    let error = message.pointee.err
    if error == RD_KAFKA_RESP_ERR_NO_ERROR {
        handler.complete(.success(KafkaDeliveryReport(topic: handler.topic, partition: message.pointee.partition,
                                                      offset: message.pointee.offset)))
    } else {
        // The producer's own errstr: rd_kafka_message_errstr is consumer-only and, on a delivery report, returns the
        // record's payload, not NUL-terminated (AddressSanitizer caught the overread; a dead letter's push token
        // reached the logs).
        let reason = rd_kafka_message_produce_errstr(message).map { String(cString: $0) }
        var failure = KafkaError(error, message: reason ?? String(cString: rd_kafka_err2str(error)))
        if error == RD_KAFKA_RESP_ERR__FATAL, let handle {
            var text = [CChar](repeating: 0, count: 512)
            let underlying = rd_kafka_fatal_error(handle, &text, text.count)
            failure.message = "\(String(cString: rd_kafka_err2name(underlying))): \(cText(text))"
        }
        handler.complete(.failure(failure))
    }
}

private func rdkafkaRebalance(_ handle: OpaquePointer?, _ error: rd_kafka_resp_err_t,
                              _ partitions: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?,
                              _ opaque: UnsafeMutableRawPointer?) {
    guard let handle, let opaque else { return }
    let context = Unmanaged<RDKafkaCallbackContext>.fromOpaque(opaque).takeUnretainedValue()
    let changed = partitions.map { RDKafkaTopicPartitionList.entries(of: $0).map(\.position.topicPartition) } ?? []
    let cooperative = rd_kafka_rebalance_protocol(handle).map { String(cString: $0) } == "COOPERATIVE"
    var failure: KafkaError?
    switch error {
    case RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS:
        if cooperative {
            if let error = rd_kafka_incremental_assign(handle, partitions) { failure = KafkaError(consuming: error) }
        } else {
            let code = rd_kafka_assign(handle, partitions)
            if code != RD_KAFKA_RESP_ERR_NO_ERROR { failure = KafkaError(code) }
        }
        // librdkafka keeps a pause the application asked for across a revocation: a partition assigned anew starts
        // unpaused, as its owner's bookkeeping (which forgot it when it was revoked) expects.
        if let partitions { _ = rd_kafka_resume_partitions(handle, partitions) }
        _ = context.onRebalance?(.assigned(changed))
    case RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS:
        // A lost assignment (the session ran out) may be another member's already: it is not committed to.
        let lost = rd_kafka_assignment_lost(handle) != 0
        do {
            let pending = try context.commitOrder.withLock { _ throws(KafkaError) -> RDKafkaPendingCommit? in
                let settled = context.onRebalance?(.revoked(changed)) ?? []
                return settled.isEmpty || lost ? nil : try rdkafkaQueueCommit(handle, settled)
            }
            // A commit that outlasts the wait may still land later, behind the next owner's: those jobs run again.
            try pending?.wait(timeout: .seconds(5))
        } catch {
            context.logger.warning("cannot commit the revoked partitions' settled offsets; their next owner may run "
                                   + "those jobs again", ["kafka.error": error.description])
        }
        if cooperative {
            if let error = rd_kafka_incremental_unassign(handle, partitions) { failure = KafkaError(consuming: error) }
        } else {
            let code = rd_kafka_assign(handle, nil)
            if code != RD_KAFKA_RESP_ERR_NO_ERROR { failure = KafkaError(code) }
        }
    default:
        failure = KafkaError(error)
        _ = rd_kafka_assign(handle, nil)
    }
    if let failure {
        context.logger.error("Kafka rebalance failed", ["kafka.error": failure.description])
    } else {
        context.logger.info("Kafka rebalance", [
            "kafka.event": error == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS ? "assigned" : "revoked",
            "kafka.partitions": changed.map(\.description).joined(separator: ","),
        ])
    }
}

/// Queues a commit of `offsets` for the consumer's group (under `RDKafkaCallbackContext.commitOrder`); its answer
/// comes on a queue of its own rather than through a synchronous commit, so that the wait is bounded.
func rdkafkaQueueCommit(_ handle: OpaquePointer, _ offsets: [KafkaTopicPartitionOffset]) throws(KafkaError) -> RDKafkaPendingCommit {
    let list = RDKafkaTopicPartitionList(offsets)  // librdkafka copies it
    guard let queue = rd_kafka_queue_new(handle) else {
        throw KafkaError(code: .destroyed, message: "no queue for the commit result")
    }
    let error = rd_kafka_commit_queue(handle, list.pointer, queue, nil, nil)
    guard error == RD_KAFKA_RESP_ERR_NO_ERROR else {
        rd_kafka_queue_destroy(queue)
        throw KafkaError(error, message: "commit \(offsets)")
    }
    return RDKafkaPendingCommit(queue: queue, offsets: offsets)
}

/// A commit librdkafka has queued, waited for once.
struct RDKafkaPendingCommit: @unchecked Sendable {  // the queue is used by one thread at a time, then destroyed
    let queue: OpaquePointer
    let offsets: [KafkaTopicPartitionOffset]

    /// Waits up to `timeout` for the broker's answer. Blocks: never on Swift's cooperative pool.
    func wait(timeout: Duration) throws(KafkaError) {
        defer { rd_kafka_queue_destroy(queue) }
        guard let event = rd_kafka_queue_poll(queue, timeout.timeoutMilliseconds) else {
            throw KafkaError(code: .timedOut, message: "no commit answer within \(timeout)")
        }
        defer { rd_kafka_event_destroy(event) }
        let eventError = rd_kafka_event_error(event)
        guard eventError == RD_KAFKA_RESP_ERR_NO_ERROR else {
            throw KafkaError(eventError, message: "commit: \(String(cString: rd_kafka_event_error_string(event)))")
        }
        if let answered = rd_kafka_event_topic_partition_list(event) {
            for entry in RDKafkaTopicPartitionList.entries(of: answered) where entry.error != RD_KAFKA_RESP_ERR_NO_ERROR {
                throw KafkaError(entry.error, message: "commit \(entry.position): " + String(cString: rd_kafka_err2str(entry.error)))
            }
        }
    }
}

/// A NUL-terminated C string filled in by librdkafka into `buffer`.
func cText(_ buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
