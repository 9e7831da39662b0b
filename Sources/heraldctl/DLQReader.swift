import Foundation
import HeraldCore
import HeraldKafka
import HeraldRuntime
import Synchronization

/// How many records a reader has read; read from other tasks for progress.
final class ScanCount: Sendable {
    let value = Atomic<Int>(0)
    var current: Int { value.load(ordering: .relaxed) }
}

/// One record of the dead-letter topic. A class: entries are passed around in batches and tuples, and a dead
/// letter has dozens of reference-counted fields to copy one by one.
final class DLQEntry: Sendable {
    let partition: Int32
    let offset: Int64
    /// When it was dead-lettered: the record's timestamp, else the record's `deadLetteredAt`.
    let time: Date?
    /// `nil` when the record is not a dead letter this version understands.
    let letter: DeadLetter?
    /// The record's text (a replay copies the payload from it).
    let record: [UInt8]
    /// The record's headers (its `herald-signature`).
    let headers: [(name: String, value: [UInt8])]
    /// The app its record key names (`<appId>/…`), if any: for records that are not readable letters.
    let keyApp: String?

    init(partition: Int32, offset: Int64, time: Date?, letter: DeadLetter?, record: [UInt8],
         headers: [(name: String, value: [UInt8])] = [], key: [UInt8]? = nil) {
        (self.partition, self.offset, self.time, self.letter, self.record) = (partition, offset, time, letter, record)
        self.headers = headers
        keyApp = key.flatMap { String(decoding: $0, as: UTF8.self).split(separator: "/", maxSplits: 1).first.map(String.init) }
    }
}

/// Reads the dead-letter topic from `--since` (found with offsets-for-times) or the beginning up to the end each
/// partition had when the reader opened, one batch at a time, so memory does not grow with the topic.
///
/// Records written after the reader opened are left for a later run. Two things make "the end" less simple than
/// an offset: a broker may report a high watermark below the last record (Tansu reports the start of the last
/// batch), and transaction markers take offsets no record is read at. So a partition is finished when it yields a
/// record stamped after the start, or shortly after every partition has reached its end offset.
final class DLQReader {
    /// Kafka's ListOffsets treats timestamp −1 as "the end of the log" and −2 as "the first record kept";
    /// `offsets(forTimestamp:)` floors to whole milliseconds, so these dates ask for exactly those.
    private static let endOfLog = Date(timeIntervalSince1970: -0.0005)
    private static let startOfLog = Date(timeIntervalSince1970: -0.0015)
    /// How long to keep reading once every partition reached its end offset (for the records a broker's end
    /// offset may leave out, such as the rest of Tansu's last batch).
    private static let settle: Duration = .milliseconds(300)
    /// How long the broker may send nothing while partitions have not reached their end.
    private static let stall: Duration = .seconds(5)

    private struct Partition {
        var next: Int64
        let end: Int64
        var finished: Bool
    }

    let topic: String
    let startedAt: Date
    /// Records below the ends seen at start, from the start offsets: the denominator of progress.
    let expected: Int64
    private let consumer: KafkaConsumer
    private let filter: DLQFilter
    private var partitions: [Int32: Partition]
    /// Records read so far (shared with the progress display).
    let scanned = ScanCount()

    private init(topic: String, consumer: KafkaConsumer, filter: DLQFilter, partitions: [Int32: Partition],
                 startedAt: Date) {
        self.topic = topic
        self.consumer = consumer
        self.filter = filter
        self.partitions = partitions
        self.startedAt = startedAt
        expected = partitions.values.reduce(0) { $0 + ($1.finished ? 0 : max(0, $1.end - $1.next)) }
    }

    /// Connects, finds where each partition starts (`filter.since`) and ends, and assigns the partitions to read.
    static func open(_ connections: Connections, filter: DLQFilter) async throws -> DLQReader {
        let startedAt = Date()
        var kafka = connections.kafka
        // The fetch queue is what a reader holds in memory: keep it well below librdkafka's 64 MiB default.
        kafka.properties["queued.max.messages.kbytes"] = "32768"
        let consumer = try KafkaConsumer(configuration: KafkaConsumerConfiguration(kafka: kafka, groupID: nil),
                                         logger: connections.logger)
        let topic = connections.dlqTopic
        do {
            _ = try await consumer.partitionCount(topic: topic)
            let ends = try await consumer.offsets(forTimestamp: endOfLog, topic: topic)
            let firsts = try await consumer.offsets(forTimestamp: startOfLog, topic: topic)
            var starts = firsts
            if let since = filter.since { starts = try await consumer.offsets(forTimestamp: since, topic: topic) }
            var partitions: [Int32: Partition] = [:]
            for end in ends {
                let first = firsts.first { $0.partition == end.partition }?.offset ?? 0
                let start = starts.first { $0.partition == end.partition }?.offset ?? KafkaTopicPartitionOffset.end
                // `.end` from offsets-for-times: no record at or after --since in this partition.
                let empty = start == KafkaTopicPartitionOffset.end || end.offset <= first
                partitions[end.partition] = Partition(next: max(start, first), end: end.offset, finished: empty)
            }
            let assigned = partitions.filter { !$0.value.finished }.map {
                KafkaTopicPartitionOffset(topic: topic, partition: $0.key, offset: $0.value.next)
            }
            if !assigned.isEmpty { try await consumer.assign(assigned) }
            return DLQReader(topic: topic, consumer: consumer, filter: filter, partitions: partitions, startedAt: startedAt)
        } catch {
            try? await consumer.close()
            throw connections.explain(error, topic: topic)
        }
    }

    /// Calls `body` with each batch of records in the time window (other filters are the caller's), until the
    /// snapshot is read or `body` returns false. Called after every poll, with an empty batch when nothing in it
    /// was in the window, so `body` can stop a scan that finds nothing (a stop request) all the same.
    func read(_ body: ([DLQEntry]) async throws -> Bool) async throws {
        var lastRecordAt = ContinuousClock.now
        var atEndsSince: ContinuousClock.Instant?
        while partitions.values.contains(where: { !$0.finished }) {
            let atEnds = partitions.values.allSatisfy { $0.finished || $0.next >= $0.end }
            if atEnds, atEndsSince == nil { atEndsSince = .now }
            // Past the ends, wait only briefly for records the broker's end offset left out; records keep
            // coming on a busy topic, so this is a deadline, not an idle timeout.
            if let atEndsSince, ContinuousClock.now - atEndsSince > Self.settle { break }
            let records = try await consumer.poll(maxRecords: 2000, timeout: atEnds ? Self.settle : .milliseconds(500))
            if records.isEmpty, atEnds { break }
            var kept: [KafkaRecord] = []
            kept.reserveCapacity(records.count)
            for record in records {
                guard var partition = partitions[record.partition], !partition.finished else { continue }
                if record.offset >= partition.end, let stamp = record.timestamp, stamp > startedAt {
                    partition.finished = true // written after this run began: the next run's business
                    partitions[record.partition] = partition
                    continue
                }
                partition.next = max(partition.next, record.offset + 1)
                partitions[record.partition] = partition
                scanned.value.add(1, ordering: .relaxed)
                kept.append(record)
            }
            // Only a record of the snapshot is progress: new letters on partitions already read do not keep a
            // stalled one's scan waiting.
            if !kept.isEmpty {
                lastRecordAt = .now
            } else if ContinuousClock.now - lastRecordAt > Self.stall {
                try checkNoPartitionFellShort()
                break
            }
            let filter = self.filter
            let entries = parallelMap(kept) { Self.entry($0, filter: filter) }.compactMap { $0 }
            if try await !body(entries) { return }
            // Time spent sending (a paced or slow replay) is not broker silence.
            if !kept.isEmpty { lastRecordAt = .now }
        }
    }

    func close() async {
        try? await consumer.close()
    }

    /// Decodes a record, skipping the work for records outside `--since`/`--until` by their timestamp.
    private static func entry(_ record: KafkaRecord, filter: DLQFilter) -> DLQEntry? {
        if let stamp = record.timestamp.map(DLQFilter.milliseconds) {
            if let since = filter.since, stamp < DLQFilter.milliseconds(since) { return nil }
            if let until = filter.until, stamp >= DLQFilter.milliseconds(until) { return nil }
        }
        let letter = try? DeadLetter.decode(record.value)
        return DLQEntry(partition: record.partition, offset: record.offset,
                        time: record.timestamp ?? letter.flatMap { Timestamp.parse($0.deadLetteredAt) }, letter: letter,
                        record: record.value, headers: record.headers, key: record.key)
    }

    /// The broker sent nothing for `stall` though partitions have not reached their end (fetches refused, say a
    /// user without Read on the topic, or a broker failing over): the scan is not complete, so it fails rather
    /// than report partial counts as the whole. One record short is tolerated (the broker's end offset may count a
    /// marker no fetch returns).
    private func checkNoPartitionFellShort() throws {
        let short = partitions.sorted { $0.key < $1.key }
            .filter { !$0.value.finished && $0.value.end - $0.value.next > 1 }
            .map { "\(topic)[\($0.key)] at offset \($0.value.next) of \($0.value.end)" }
        guard !short.isEmpty else { return }
        throw OperatorError("the broker sent nothing for \(Self.stall) while \(short.joined(separator: ", ")) had "
                            + "records left: the scan stopped short. Check the broker and that the Kafka user may read "
                            + "\(topic), then run the command again")
    }
}
