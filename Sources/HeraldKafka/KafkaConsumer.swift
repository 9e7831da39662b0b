internal import CRdKafka
import Foundation
import HeraldRuntime
import Synchronization

/// A Kafka consumer: a consumer-group member with manual commits, or a group-less reader of assigned partitions.
///
/// Every method that talks to the broker runs on a thread the consumer owns, one at a time, so they never block
/// Swift's cooperative pool; rebalance handlers run on that thread too, during `poll`. Commits have a thread of
/// their own, so waiting for a commit's answer never delays the next `poll`. A group member must keep
/// calling `poll` (within `maxPollInterval`) and `close()` when done, which leaves the group at once (a member
/// that just disappears blocks its group's rebalances until its session times out).
public final class KafkaConsumer: Sendable {
    private let client: RDKafkaClient
    private let thread: OwnedThread
    /// Where `commit` waits for the broker's answer (librdkafka's commit calls are thread-safe).
    private let commitThread: OwnedThread
    private let timeout: Duration
    private let closed = Atomic(false)
    private let isGroupMember: Bool

    /// Creates the consumer. `onRebalance` (group members only) learns of partitions assigned to and revoked from
    /// this member, and says what to commit before revoked ones go (`KafkaRebalanceHandler`).
    public init(configuration: KafkaConsumerConfiguration, logger: Logger,
                onRebalance: KafkaRebalanceHandler? = nil) throws(KafkaError) {
        try configuration.kafka.validate()
        // Without a handler librdkafka assigns by itself; with one, the C callback assigns, then tells the caller.
        client = try RDKafkaClient(kind: .consumer, properties: configuration.librdkafkaProperties, logger: logger,
                                   onRebalance: configuration.groupID == nil ? nil : onRebalance ?? { _ in [] })
        timeout = configuration.kafka.requestTimeout
        isGroupMember = configuration.groupID != nil
        thread = OwnedThread(name: "kafka-consumer")
        commitThread = OwnedThread(name: "kafka-commit")
    }

    deinit {
        commitThread.stop()
        thread.stop()
        // The client's deinit (rd_kafka_destroy) still leaves the group if close() was not called.
    }

    /// Joins the group and consumes `topics`; partitions arrive through rebalances during `poll`.
    public func subscribe(topics: [String]) async throws(KafkaError) {
        guard isGroupMember else {
            throw KafkaError(code: .invalidArgument, message: "a consumer without a group id cannot subscribe")
        }
        let client = self.client
        try await run { () throws(KafkaError) in
            let list = RDKafkaTopicPartitionList(topics.map {
                KafkaTopicPartitionOffset(topic: $0, partition: RD_KAFKA_PARTITION_UA, offset: 0)
            })
            let error = rd_kafka_subscribe(client.handle, list.pointer)
            guard error == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(error, message: "subscribe \(topics)") }
        }
    }

    /// Reads exactly these partitions from these offsets, outside any group (for replay tools). Offsets may be
    /// real ones or `KafkaTopicPartitionOffset.beginning` / `.end` / `.committed`. Replaces any earlier assignment.
    public func assign(_ partitions: [KafkaTopicPartitionOffset]) async throws(KafkaError) {
        let client = self.client
        try await run { () throws(KafkaError) in
            let list = RDKafkaTopicPartitionList(partitions)
            let error = rd_kafka_assign(client.handle, list.pointer)
            guard error == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(error, message: "assign \(partitions)") }
        }
    }

    /// Waits up to `timeout` for records and returns at most `maxRecords` of them (empty when none came).
    ///
    /// Rebalance handlers run inside this call. Transient consumer errors (a broker connection dropped) are
    /// logged, not thrown: librdkafka recovers by itself. A fatal error is thrown.
    public func poll(maxRecords: Int = 500, timeout: Duration) async throws(KafkaError) -> [KafkaRecord] {
        let client = self.client
        return try await run { () throws(KafkaError) in
            var records: [KafkaRecord] = []
            var wait = timeout.timeoutMilliseconds
            while records.count < maxRecords, let message = rd_kafka_consumer_poll(client.handle, wait) {
                defer { rd_kafka_message_destroy(message) }
                wait = 0 // Only the first record is waited for; the rest is what is already fetched.
                let error = message.pointee.err
                if error == RD_KAFKA_RESP_ERR_NO_ERROR {
                    records.append(Self.record(from: message))
                } else if let fatal = client.fatalError {
                    throw fatal
                } else if error != RD_KAFKA_RESP_ERR__PARTITION_EOF {
                    client.logger.warning("Kafka consumer error", [
                        "kafka.error": String(cString: rd_kafka_err2name(error)),
                        "kafka.detail": String(cString: rd_kafka_message_errstr(message)),
                    ])
                }
            }
            return records
        }
    }

    /// Moves these assigned partitions' fetch positions: their next records come from these offsets. Records
    /// already fetched past them are discarded and fetched again.
    public func seek(_ positions: [KafkaTopicPartitionOffset]) async throws(KafkaError) {
        guard !positions.isEmpty else { return }
        let client = self.client, timeout = self.timeout
        try await run { () throws(KafkaError) in
            let list = RDKafkaTopicPartitionList(positions)
            if let error = rd_kafka_seek_partitions(client.handle, list.pointer, timeout.timeoutMilliseconds) {
                throw KafkaError(consuming: error)
            }
            try list.checkErrors("seek")
        }
    }

    /// Stops fetching these assigned partitions until `resume`; their positions stay. A partition assigned anew
    /// (after a rebalance) starts unpaused.
    public func pause(_ partitions: [KafkaTopicPartition]) async throws(KafkaError) {
        try await setPaused(partitions, true)
    }

    /// Fetches these paused partitions again, from their positions.
    public func resume(_ partitions: [KafkaTopicPartition]) async throws(KafkaError) {
        try await setPaused(partitions, false)
    }

    private func setPaused(_ partitions: [KafkaTopicPartition], _ paused: Bool) async throws(KafkaError) {
        guard !partitions.isEmpty else { return }
        let client = self.client
        try await run { () throws(KafkaError) in
            let list = RDKafkaTopicPartitionList(partitions.map {
                KafkaTopicPartitionOffset(topic: $0.topic, partition: $0.partition, offset: 0)
            })
            let error = paused ? rd_kafka_pause_partitions(client.handle, list.pointer)
                               : rd_kafka_resume_partitions(client.handle, list.pointer)
            guard error == RD_KAFKA_RESP_ERR_NO_ERROR else {
                throw KafkaError(error, message: paused ? "pause" : "resume")
            }
            try list.checkErrors(paused ? "pause" : "resume")
        }
    }

    /// Commits these positions for the group and waits for the broker's answer (bounded by the request timeout).
    /// A position is the next offset to read: use `KafkaRecord.offsetToCommit` for a handled record.
    public func commit(_ offsets: [KafkaTopicPartitionOffset]) async throws(KafkaError) {
        guard !offsets.isEmpty else { return }
        _ = try await commit { offsets }
    }

    /// Commits the positions `positions` gives and waits for the broker's answer; returns them. They are read when
    /// the commit is queued, in order with the commit a revocation makes (`KafkaRebalanceHandler`): an older one
    /// read before it is not sent after it.
    public func commit(_ positions: @escaping @Sendable () -> [KafkaTopicPartitionOffset]) async throws(KafkaError)
        -> [KafkaTopicPartitionOffset] {
        guard isGroupMember else {
            throw KafkaError(code: .invalidArgument, message: "a consumer without a group id cannot commit")
        }
        let client = self.client, timeout = self.timeout
        guard !closed.load(ordering: .acquiring) else { throw .closed("consumer") }
        return try await commitThread.run { () throws(KafkaError) -> [KafkaTopicPartitionOffset] in
            guard let pending = try client.commitOrder.withLock({ _ throws(KafkaError) -> RDKafkaPendingCommit? in
                let offsets = positions()
                return offsets.isEmpty ? nil : try rdkafkaQueueCommit(client.handle, offsets)
            }) else { return [] }
            try pending.wait(timeout: timeout)
            return pending.offsets
        }
    }

    /// The group's committed positions for these partitions (`KafkaTopicPartitionOffset.end`… when none).
    public func committed(_ partitions: [KafkaTopicPartition]) async throws(KafkaError) -> [KafkaTopicPartitionOffset] {
        let client = self.client, timeout = self.timeout
        return try await run { () throws(KafkaError) in
            let list = RDKafkaTopicPartitionList(partitions.map {
                KafkaTopicPartitionOffset(topic: $0.topic, partition: $0.partition, offset: KafkaTopicPartitionOffset.committed)
            })
            let error = rd_kafka_committed(client.handle, list.pointer, timeout.timeoutMilliseconds)
            guard error == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(error, message: "committed offsets") }
            try list.checkErrors("committed offset of")
            return list.entries.map(\.position)
        }
    }

    /// Each partition's log start offset (low watermark), asked of its leader: offsets below it were deleted
    /// (retention) and can no longer be read.
    public func logStartOffsets(_ partitions: [KafkaTopicPartition]) async throws(KafkaError) -> [KafkaTopicPartition: Int64] {
        let client = self.client, timeout = self.timeout
        return try await run { () throws(KafkaError) in
            var starts: [KafkaTopicPartition: Int64] = [:]
            for partition in partitions {
                var low: Int64 = -1, high: Int64 = -1
                let error = rd_kafka_query_watermark_offsets(client.handle, partition.topic, partition.partition, &low, &high,
                                                             timeout.timeoutMilliseconds)
                guard error == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(error, message: "log start of \(partition)") }
                starts[partition] = low
            }
            return starts
        }
    }

    /// Position and last reported high watermark of every assigned partition. Positions come from what `poll`
    /// returned, or the group's committed offset for a partition nothing was received from yet; watermarks are
    /// librdkafka's cache of the broker's fetch responses (no request).
    public func progress() async throws(KafkaError) -> [KafkaPartitionProgress] {
        let client = self.client, timeout = self.timeout
        return try await run { () throws(KafkaError) in
            var assigned: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?
            let error = rd_kafka_assignment(client.handle, &assigned)
            guard error == RD_KAFKA_RESP_ERR_NO_ERROR, let assigned else { throw KafkaError(error, message: "assignment") }
            defer { rd_kafka_topic_partition_list_destroy(assigned) }
            guard rd_kafka_position(client.handle, assigned) == RD_KAFKA_RESP_ERR_NO_ERROR else { return [] }
            var positions = RDKafkaTopicPartitionList.entries(of: assigned).map(\.position)
            let unknown = positions.filter { $0.offset < 0 }
            if !unknown.isEmpty {
                let list = RDKafkaTopicPartitionList(unknown)
                if rd_kafka_committed(client.handle, list.pointer, timeout.timeoutMilliseconds) == RD_KAFKA_RESP_ERR_NO_ERROR {
                    let committed = Dictionary(list.entries.map { ($0.position.topicPartition, $0.position.offset) },
                                               uniquingKeysWith: { first, _ in first })
                    positions = positions.map { position in
                        var position = position
                        if position.offset < 0 { position.offset = committed[position.topicPartition] ?? position.offset }
                        return position
                    }
                }
            }
            return positions.map { position in
                var low: Int64 = -1, high: Int64 = -1
                _ = rd_kafka_get_watermark_offsets(client.handle, position.topic, position.partition, &low, &high)
                return KafkaPartitionProgress(partition: position.topicPartition, position: position.offset,
                                              highWatermark: high)
            }
        }
    }

    /// For each partition of `topic`, the earliest offset whose record timestamp is at or after `timestamp`
    /// (`KafkaTopicPartitionOffset.end` where there is none). A replay starts there with `assign`.
    public func offsets(forTimestamp timestamp: Date, topic: String) async throws(KafkaError) -> [KafkaTopicPartitionOffset] {
        let client = self.client, timeout = self.timeout
        return try await run { () throws(KafkaError) in
            let count = try client.partitionCount(topic: topic, timeout: timeout)
            let milliseconds = Int64((timestamp.timeIntervalSince1970 * 1000).rounded(.down))
            let list = RDKafkaTopicPartitionList((0..<count).map {
                KafkaTopicPartitionOffset(topic: topic, partition: Int32($0), offset: milliseconds)
            })
            let error = rd_kafka_offsets_for_times(client.handle, list.pointer, timeout.timeoutMilliseconds)
            guard error == RD_KAFKA_RESP_ERR_NO_ERROR else {
                throw KafkaError(error, message: "offsets for times of \(topic): \(String(cString: rd_kafka_err2str(error)))")
            }
            try list.checkErrors("offset for time of")
            return list.entries.map(\.position)
        }
    }

    /// Partition count of `topic` from the broker's metadata.
    public func partitionCount(topic: String) async throws(KafkaError) -> Int {
        let client = self.client, timeout = self.timeout
        return try await run { () throws(KafkaError) in try client.partitionCount(topic: topic, timeout: timeout) }
    }

    /// Leaves the group (revoking this member's partitions, so handlers run once more), stops the consumer and
    /// disconnects. Uncommitted records will be delivered again to whoever gets their partitions.
    public func close() async throws(KafkaError) {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let (client, commitThread) = (self.client, self.commitThread)
        // All of it blocks (a commit under way, leaving the group, librdkafka's threads ending), so all of it runs
        // on the consumer's thread, which is then idle and stops at once: none on Swift's cooperative pool.
        defer { thread.stop() }
        try await thread.run { () throws(KafkaError) in
            commitThread.stop() // a commit under way finishes first (stop runs the queued jobs)
            let error = rd_kafka_consumer_close(client.handle)
            client.destroy()
            guard error == RD_KAFKA_RESP_ERR_NO_ERROR else { throw KafkaError(error, message: "leaving the group") }
        }
    }

    private func run<T: Sendable>(_ body: @escaping @Sendable () throws(KafkaError) -> T) async throws(KafkaError) -> T {
        guard !closed.load(ordering: .acquiring) else { throw .closed("consumer") }
        let client = self.client
        return try await thread.run { () throws(KafkaError) -> T in
            // A call that passed the check as `close` began is queued behind it: the handle is gone by then.
            guard !client.isDestroyed else { throw .closed("consumer") }
            return try body()
        }
    }

    private static func record(from message: UnsafeMutablePointer<rd_kafka_message_t>) -> KafkaRecord {
        let entry = message.pointee
        var headers: [(name: String, value: [UInt8])] = []
        var headerList: OpaquePointer?
        if rd_kafka_message_headers(message, &headerList) == RD_KAFKA_RESP_ERR_NO_ERROR, let headerList {
            var name: UnsafePointer<CChar>?
            var value: UnsafeRawPointer?
            var size = 0
            var index = 0
            while rd_kafka_header_get_all(headerList, index, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR {
                headers.append((name.map { String(cString: $0) } ?? "", bytes(value, size)))
                index += 1
            }
        }
        var timestampType = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE
        let milliseconds = rd_kafka_message_timestamp(message, &timestampType)
        return KafkaRecord(
            topic: entry.rkt.map { String(cString: rd_kafka_topic_name($0)) } ?? "",
            partition: entry.partition, offset: entry.offset,
            key: entry.key.map { bytes($0, entry.key_len) },
            value: bytes(entry.payload, entry.len),
            headers: headers,
            timestamp: timestampType == RD_KAFKA_TIMESTAMP_NOT_AVAILABLE || milliseconds < 0
                ? nil : Date(timeIntervalSince1970: Double(milliseconds) / 1000))
    }

    private static func bytes(_ pointer: UnsafeRawPointer?, _ count: Int) -> [UInt8] {
        guard let pointer, count > 0 else { return [] }
        return Array(UnsafeRawBufferPointer(start: pointer, count: count))
    }
}
