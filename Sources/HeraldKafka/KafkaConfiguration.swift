import Foundation
import HeraldRuntime

/// Settings every Kafka client shares: where the brokers are, who we are, how requests are secured, and how long
/// they may take.
public struct KafkaConfiguration: Sendable, Hashable {
    /// Bootstrap brokers as `host:port`.
    public var brokers: [String]
    /// `client.id`, shown in broker logs and librdkafka's log lines.
    public var clientID: String
    /// Upper bound for one metadata, admin, commit or offsets request made through this wrapper. Default 10 s.
    public var requestTimeout: Duration
    /// `socket.timeout.ms`: how long a broker may leave a request unanswered before the connection is
    /// considered broken. Default 10 s.
    public var socketTimeout: Duration
    /// Encryption and authentication, and the operator's pass-through properties. Default: plaintext.
    public var security = KafkaSecurity()
    /// Extra librdkafka properties (see librdkafka's CONFIGURATION.md). Applied last, so they override
    /// everything this wrapper sets.
    public var properties: [String: String]

    public init(brokers: [String], clientID: String = "herald", requestTimeout: Duration = .seconds(10),
                socketTimeout: Duration = .seconds(10), properties: [String: String] = [:]) {
        self.brokers = brokers
        self.clientID = clientID
        self.requestTimeout = requestTimeout
        self.socketTimeout = socketTimeout
        self.properties = properties
    }

    /// Brokers from a comma-separated list such as `HERALD_KAFKA_BROKERS=10.0.0.1:9092,10.0.0.2:9092`.
    public init(brokerList: String, clientID: String = "herald") {
        self.init(brokers: brokerList.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
            .filter { !$0.isEmpty }, clientID: clientID)
    }

    /// From `HERALD_KAFKA_BROKERS` and the security variables (`KafkaSecurity(environment:)`).
    public init(environment env: EnvironmentReader, clientID: String) throws(ConfigurationError) {
        self.init(brokerList: env.string("HERALD_KAFKA_BROKERS", default: "127.0.0.1:9092"), clientID: clientID)
        security = try KafkaSecurity(environment: env)
    }

    /// The librdkafka properties of the admin client.
    public var librdkafkaProperties: [String: String] {
        var out = baseProperties
        // Asking for a missing topic's metadata must not create it.
        out["allow.auto.create.topics"] = "false"
        return overriding(out)
    }

    var baseProperties: [String: String] {
        [
            "bootstrap.servers": brokers.joined(separator: ","),
            "client.id": clientID,
            "socket.timeout.ms": String(socketTimeout.milliseconds(atLeast: 10)),
            // Brokers close idle connections; librdkafka would log each as an error.
            "log.connection.close": "false",
        ].merging(security.properties) { _, secured in secured }
    }

    /// A client's properties with the operator's pass-through properties and then `properties` on top.
    func overriding(_ own: [String: String]) -> [String: String] {
        own.merging(security.extraProperties) { _, extra in extra }.merging(properties) { _, extra in extra }
    }

    func validate() throws(KafkaError) {
        guard !brokers.isEmpty else {
            throw KafkaError(code: .invalidArgument, message: "no Kafka brokers configured")
        }
    }
}

/// Settings of a `KafkaProducer`. Defaults suit a service that answers only after the broker acknowledged.
public struct KafkaProducerConfiguration: Sendable, Hashable {
    public var kafka: KafkaConfiguration
    /// `message.timeout.ms`: a `send` fails with `.messageTimedOut` if the record is not acknowledged by then.
    /// Default 5 s.
    public var messageTimeout: Duration
    /// `linger.ms`: how long librdkafka waits to fill a batch. Each awaited send pays it, so keep it ≤ 1 ms
    /// unless throughput matters more than latency. Default 1 ms.
    public var linger: Duration
    /// `queue.buffering.max.messages`: records queued locally before `send` fails with `.queueFull`.
    /// Default 100 000.
    public var maxBufferedMessages: Int
    /// `queue.buffering.max.kbytes`: bytes queued locally (in KiB) before `send` fails with `.queueFull`.
    /// Default 65 536 (64 MiB), which keeps memory flat when the broker is slow or gone.
    public var maxBufferedKilobytes: Int

    public init(kafka: KafkaConfiguration, messageTimeout: Duration = .seconds(5), linger: Duration = .milliseconds(1),
                maxBufferedMessages: Int = 100_000, maxBufferedKilobytes: Int = 65_536) {
        self.kafka = kafka
        self.messageTimeout = messageTimeout
        self.linger = linger
        self.maxBufferedMessages = maxBufferedMessages
        self.maxBufferedKilobytes = maxBufferedKilobytes
    }

    /// The librdkafka properties this configuration produces (`kafka.properties` applied last).
    public var librdkafkaProperties: [String: String] {
        var out = kafka.baseProperties
        out.merge([
            // Exactly-once per partition and no reordering on retries; implies acks=all.
            "enable.idempotence": "true",
            "acks": "all",
            "message.timeout.ms": String(messageTimeout.milliseconds(atLeast: 1)),
            "linger.ms": linger.fractionalMilliseconds,
            "queue.buffering.max.messages": String(maxBufferedMessages),
            "queue.buffering.max.kbytes": String(maxBufferedKilobytes),
            // librdkafka notices timed-out records when a broker thread wakes up; with the default 10 s reconnect
            // backoff a record outlives message.timeout.ms by that much while the broker is down, and a broker
            // that comes back is found that much later.
            "reconnect.backoff.max.ms": "1000",
            // librdkafka's producer default asks the broker to create a missing topic on first use, with the
            // broker's default partition count; a missing topic must fail the send instead.
            "allow.auto.create.topics": "false",
        ]) { _, new in new }
        return kafka.overriding(out)
    }
}

/// Settings of a `KafkaConsumer`.
public struct KafkaConsumerConfiguration: Sendable, Hashable {
    /// Where a group member starts on a partition that has no committed offset.
    public enum OffsetReset: String, Sendable, Hashable {
        case earliest, latest
    }

    public var kafka: KafkaConfiguration
    /// A `group.id` for consumers that only `assign`: librdkafka needs one for `assign`, but such a consumer
    /// never joins that group nor commits to it, so every such consumer may share it.
    public static let assignOnlyGroupID = "herald.assign-only"

    /// `group.id`. `nil` for a consumer that only reads partitions it `assign`s (no group membership, no commits).
    public var groupID: String?
    /// `group.instance.id`: a static member. One that comes back under the same id within `sessionTimeout`
    /// takes its partitions back at once, with no rebalance; one that leaves does not hand them back until the
    /// session times out. Each member of a group needs its own id.
    public var groupInstanceID: String?
    /// `session.timeout.ms`: a member that sends no heartbeat for this long is removed from the group.
    /// Default 45 s.
    public var sessionTimeout: Duration
    /// `heartbeat.interval.ms`. Default 3 s.
    public var heartbeatInterval: Duration
    /// `max.poll.interval.ms`: a member that does not poll for this long leaves the group. Default 300 s.
    public var maxPollInterval: Duration
    /// `auto.offset.reset`. Default `.earliest`: a new group reads everything (never loses jobs).
    public var offsetReset: OffsetReset

    public init(kafka: KafkaConfiguration, groupID: String?, sessionTimeout: Duration = .seconds(45),
                heartbeatInterval: Duration = .seconds(3), maxPollInterval: Duration = .seconds(300),
                offsetReset: OffsetReset = .earliest) {
        self.kafka = kafka
        self.groupID = groupID
        self.sessionTimeout = sessionTimeout
        self.heartbeatInterval = heartbeatInterval
        self.maxPollInterval = maxPollInterval
        self.offsetReset = offsetReset
    }

    /// The librdkafka properties this configuration produces (`kafka.properties` applied last).
    public var librdkafkaProperties: [String: String] {
        var out = kafka.baseProperties
        out.merge([
            // Offsets are committed only through `commit`, after the work is done (at-least-once).
            "enable.auto.commit": "false",
            "enable.auto.offset.store": "false",
            "enable.partition.eof": "false",
            "auto.offset.reset": offsetReset.rawValue,
            "session.timeout.ms": String(sessionTimeout.milliseconds(atLeast: 1)),
            "heartbeat.interval.ms": String(heartbeatInterval.milliseconds(atLeast: 1)),
            "max.poll.interval.ms": String(maxPollInterval.milliseconds(atLeast: 1)),
        ]) { _, new in new }
        out["group.id"] = groupID ?? Self.assignOnlyGroupID
        if let groupInstanceID, groupID != nil { out["group.instance.id"] = groupInstanceID }
        return kafka.overriding(out)
    }
}

extension Duration {
    /// Whole milliseconds, never below `floor` (librdkafka rejects 0 for most timeouts).
    func milliseconds(atLeast floor: Int64 = 0) -> Int64 { Swift.max(floor, inMilliseconds) }

    /// A timeout argument for librdkafka calls taking `int timeout_ms`.
    var timeoutMilliseconds: Int32 { Int32(clamping: milliseconds()) }

    /// Milliseconds with a fraction where needed (`linger.ms` is a float property).
    var fractionalMilliseconds: String {
        let micros = inMicroseconds
        if micros % 1000 == 0 { return String(Swift.max(0, micros / 1000)) }
        return String(Double(Swift.max(0, micros)) / 1000)
    }
}
