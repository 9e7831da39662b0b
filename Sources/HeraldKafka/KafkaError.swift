internal import CRdKafka

/// A failure reported by librdkafka or by this wrapper, with librdkafka's error code.
///
/// `isRetriable` says the same request may succeed when sent again (a full local queue, a timeout, a broker
/// that is not reachable right now); `isFatal` says the client instance is unusable and must be recreated
/// (an idempotent producer that lost its guarantees).
public struct KafkaError: Error, Sendable, Hashable, CustomStringConvertible {
    /// librdkafka's `rd_kafka_resp_err_t`: negative values are local (client) errors, positive ones come from
    /// the broker.
    public struct Code: RawRepresentable, Sendable, Hashable, CustomStringConvertible {
        public var rawValue: Int32
        public init(rawValue: Int32) { self.rawValue = rawValue }
        init(_ error: rd_kafka_resp_err_t) { self.rawValue = error.rawValue }

        /// The local producer queue is full (`queue.buffering.max.*`); retry after some records are acknowledged.
        public static let queueFull = Code(RD_KAFKA_RESP_ERR__QUEUE_FULL)
        /// The record was not acknowledged within `message.timeout.ms`.
        public static let messageTimedOut = Code(RD_KAFKA_RESP_ERR__MSG_TIMED_OUT)
        /// A request (metadata, commit, admin, offsets) did not finish in time.
        public static let timedOut = Code(RD_KAFKA_RESP_ERR__TIMED_OUT)
        /// A broker connection failed.
        public static let transport = Code(RD_KAFKA_RESP_ERR__TRANSPORT)
        /// No broker is reachable.
        public static let allBrokersDown = Code(RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN)
        /// The client raised a fatal error; see `KafkaError.message` for the underlying one.
        public static let fatal = Code(RD_KAFKA_RESP_ERR__FATAL)
        /// The client was closed before the operation finished (or was started after `close()`).
        public static let destroyed = Code(RD_KAFKA_RESP_ERR__DESTROY)
        /// A bad argument or configuration property.
        public static let invalidArgument = Code(RD_KAFKA_RESP_ERR__INVALID_ARG)
        /// The topic or partition does not exist (yet).
        public static let unknownTopicOrPartition = Code(RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
        /// `createTopic` found the topic already there.
        public static let topicAlreadyExists = Code(RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
        /// A queued record was dropped by `close()` before it was sent.
        public static let purgedFromQueue = Code(RD_KAFKA_RESP_ERR__PURGE_QUEUE)
        /// An in-flight record was dropped by `close()`: it may or may not have been written.
        public static let purgedInFlight = Code(RD_KAFKA_RESP_ERR__PURGE_INFLIGHT)
        /// The record is larger than the client or broker allows.
        public static let messageTooLarge = Code(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE)

        /// librdkafka's symbolic name, e.g. `_QUEUE_FULL` or `NOT_ENOUGH_REPLICAS`.
        public var name: String { String(cString: rd_kafka_err2name(rd_kafka_resp_err_t(rawValue: rawValue))) }
        public var description: String { name }

        /// Whether a request that failed with this code may succeed when sent again.
        public var isRetriable: Bool { Code.retriable.contains(rawValue) }

        /// Whether the broker refused this record itself (too large, malformed, an invalid topic name): sending
        /// the same record again can never succeed.
        public var refusesTheRecordForGood: Bool { Code.refusedForGood.contains(rawValue) }

        private static let refusedForGood: Set<Int32> = Set([
            RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE,
            RD_KAFKA_RESP_ERR_INVALID_RECORD, RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION, RD_KAFKA_RESP_ERR__INVALID_ARG,
        ].map(\.rawValue))

        // Transient conditions per the Kafka protocol (RetriableException in the Java client) plus librdkafka's
        // local ones that mean "not now" rather than "never".
        private static let retriable: Set<Int32> = Set([
            RD_KAFKA_RESP_ERR__TRANSPORT, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, RD_KAFKA_RESP_ERR__QUEUE_FULL,
            RD_KAFKA_RESP_ERR__TIMED_OUT, RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN, RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE,
            RD_KAFKA_RESP_ERR__WAIT_COORD, RD_KAFKA_RESP_ERR__RESOLVE, RD_KAFKA_RESP_ERR__PURGE_QUEUE,
            RD_KAFKA_RESP_ERR__PURGE_INFLIGHT,
            RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND, RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
            RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION,
            RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS, RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
            RD_KAFKA_RESP_ERR_NOT_COORDINATOR, RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS,
            RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR, RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
            RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE, RD_KAFKA_RESP_ERR_REPLICA_NOT_AVAILABLE,
            RD_KAFKA_RESP_ERR_FENCED_LEADER_EPOCH, RD_KAFKA_RESP_ERR_UNKNOWN_LEADER_EPOCH,
            RD_KAFKA_RESP_ERR_OFFSET_NOT_AVAILABLE, RD_KAFKA_RESP_ERR_THROTTLING_QUOTA_EXCEEDED,
            RD_KAFKA_RESP_ERR_UNSTABLE_OFFSET_COMMIT, RD_KAFKA_RESP_ERR_CONCURRENT_TRANSACTIONS,
        ].map(\.rawValue))
    }

    public var code: Code
    /// What went wrong, from librdkafka where it said more than the code's generic text.
    public var message: String
    public var isRetriable: Bool
    public var isFatal: Bool

    /// An error with the classification that follows from `code` unless given.
    public init(code: Code, message: String? = nil, isRetriable: Bool? = nil, isFatal: Bool? = nil) {
        self.code = code
        self.message = message ?? String(cString: rd_kafka_err2str(rd_kafka_resp_err_t(rawValue: code.rawValue)))
        self.isFatal = isFatal ?? (code == .fatal)
        self.isRetriable = isRetriable ?? (!self.isFatal && code.isRetriable)
    }

    public var description: String {
        "KafkaError(\(code.name)\(isFatal ? ", fatal" : isRetriable ? ", retriable" : "")): \(message)"
    }

    init(_ error: rd_kafka_resp_err_t, message: String? = nil) {
        self.init(code: Code(error), message: message)
    }

    /// Takes over an `rd_kafka_error_t` (which carries its own retriable/fatal flags) and destroys it.
    init(consuming error: OpaquePointer) {
        defer { rd_kafka_error_destroy(error) }
        let code = Code(rd_kafka_error_code(error))
        let isFatal = rd_kafka_error_is_fatal(error) != 0
        // librdkafka flags few local conditions as retriable (not even a full queue); the code decides too.
        self.init(code: code, message: String(cString: rd_kafka_error_string(error)),
                  isRetriable: !isFatal && (rd_kafka_error_is_retriable(error) != 0 || code.isRetriable),
                  isFatal: isFatal)
    }

    static func closed(_ what: String) -> KafkaError {
        KafkaError(code: .destroyed, message: "the \(what) is closed")
    }
}
