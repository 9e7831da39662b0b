import Foundation

/// Where the broker stored an acknowledged record.
public struct KafkaDeliveryReport: Sendable, Hashable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64

    public init(topic: String, partition: Int32, offset: Int64) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
    }
}

/// One record read by a `KafkaConsumer`.
public struct KafkaRecord: Sendable {
    public var topic: String
    public var partition: Int32
    public var offset: Int64
    public var key: [UInt8]?
    /// The payload; empty for a record with a null value.
    public var value: [UInt8]
    /// Headers in the order the producer wrote them (names may repeat).
    public var headers: [(name: String, value: [UInt8])]
    /// The record's timestamp (create time or log-append time), when the broker has one.
    public var timestamp: Date?

    public init(topic: String, partition: Int32, offset: Int64, key: [UInt8]?, value: [UInt8],
                headers: [(name: String, value: [UInt8])], timestamp: Date?) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.headers = headers
        self.timestamp = timestamp
    }

    /// The offset to commit once this record is handled: Kafka commits the next offset to read.
    public var offsetToCommit: KafkaTopicPartitionOffset {
        KafkaTopicPartitionOffset(topic: topic, partition: partition, offset: offset + 1)
    }
}

/// A partition of a topic.
public struct KafkaTopicPartition: Sendable, Hashable, CustomStringConvertible {
    public var topic: String
    public var partition: Int32

    public init(topic: String, partition: Int32) {
        self.topic = topic
        self.partition = partition
    }

    public var description: String { "\(topic)[\(partition)]" }
}

/// A partition and an offset in it: a commit position, an `assign` start, or an `offsets(forTimestamp:)` answer.
public struct KafkaTopicPartitionOffset: Sendable, Hashable, CustomStringConvertible {
    /// Read from the first record still kept.
    public static let beginning: Int64 = -2
    /// Read only records written from now on (in answers: no record at or after the asked time).
    public static let end: Int64 = -1
    /// Read from the group's committed offset.
    public static let committed: Int64 = -1000

    public var topic: String
    public var partition: Int32
    public var offset: Int64

    public init(topic: String, partition: Int32, offset: Int64) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
    }

    public var topicPartition: KafkaTopicPartition { KafkaTopicPartition(topic: topic, partition: partition) }
    public var description: String { "\(topic)[\(partition)]@\(offset)" }
}

/// Told of each rebalance (on the consumer's thread, during `poll`, holding the consumer's commit lock: it must not
/// wait on the consumer or a commit). For `.revoked` it returns the positions to commit for those partitions before
/// they go (committed then, waiting up to 5 s for the broker's answer, so the next owner does not run again what was
/// done; not when the assignment was lost, as another member may own them already); `[]` for `.assigned`.
public typealias KafkaRebalanceHandler = @Sendable (KafkaRebalanceEvent) -> [KafkaTopicPartitionOffset]

/// A consumer-group rebalance as seen by this member.
public enum KafkaRebalanceEvent: Sendable, Hashable {
    /// These partitions are now this member's (already assigned when the handler runs).
    case assigned([KafkaTopicPartition])
    /// These partitions are being taken away: stop working on them (they are unassigned after the handler runs).
    case revoked([KafkaTopicPartition])
}

/// A topic as the broker's metadata describes it.
public struct KafkaTopicMetadata: Sendable, Hashable {
    public var name: String
    public var partitionCount: Int

    public init(name: String, partitionCount: Int) {
        self.name = name
        self.partitionCount = partitionCount
    }
}

/// How far a consumer has read one assigned partition, against what the broker last said it holds.
public struct KafkaPartitionProgress: Sendable, Hashable {
    public var partition: KafkaTopicPartition
    /// The next offset the application will receive (its last record's offset + 1, else the committed offset).
    public var position: Int64
    /// The broker's high watermark as reported with its last fetch response (-1 when none came yet).
    public var highWatermark: Int64

    public init(partition: KafkaTopicPartition, position: Int64, highWatermark: Int64) {
        self.partition = partition
        self.position = position
        self.highWatermark = highWatermark
    }

    /// Records the broker holds beyond the position (0 when unknown).
    public var lag: Int64 { position >= 0 && highWatermark > position ? highWatermark - position : 0 }
}
