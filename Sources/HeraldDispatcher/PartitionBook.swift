import HeraldKafka
import HeraldRuntime

/// Partitions assigned to this member, their unsettled offsets, and the tail job of each record key.
final class PartitionBook: Sendable {
    private struct Track {
        var generation: Int
        var offsets = PartitionOffsets()
        /// The last job started per record key, which the next job of that key waits for.
        var tails: [[UInt8]: (offset: Int64, task: Task<Void, Never>)] = [:]
        var tasks: [Int64: Task<Void, Never>] = [:]
        /// Jobs started and not finished, per record key (running, or waiting for the one before).
        var queued: [[UInt8]: Int] = [:]
        /// The key whose queue paused the partition (`JobConsumer`), until fewer than half of its jobs are left.
        var pausedFor: [UInt8]?
        /// When missing offsets are to be read again next, and the wait after that (doubling while they stay
        /// missing, so a record the broker keeps leaving out does not turn into a seek per poll).
        var rereadDue: ContinuousClock.Instant?
        var rereadBackoff = PartitionBook.firstRereadBackoff
    }

    static let firstRereadBackoff = Duration.seconds(1)
    static let maxRereadBackoff = Duration.seconds(30)

    private struct State {
        var tracks: [KafkaTopicPartition: Track] = [:]
        var generation = 0
        var inFlight = 0
        /// The group has given the current consumer an assignment (possibly empty: more members than partitions).
        var joined = false
        /// Partitions revoked since `beginPoll()`.
        var revokedDuringPoll: Set<KafkaTopicPartition> = []
        /// Partitions newly assigned since `beginPoll()`.
        var assignedDuringPoll: Set<KafkaTopicPartition> = []
    }

    private let state = Lock(State())
    private let metrics: DispatcherMetrics

    init(metrics: DispatcherMetrics) { self.metrics = metrics }

    var inFlight: Int { state.withLock { $0.inFlight } }

    /// True once the group has assigned partitions (or none) to the current consumer: it can deliver.
    var joined: Bool { state.withLock { $0.joined } }

    /// The consumer leaves the group (shutdown, or replaced after a stall): not joined until the next assignment.
    func leaving() { state.withLock { $0.joined = false } }

    func beginPoll() {
        state.withLock { s in
            s.revokedDuringPoll = []
            s.assignedDuringPoll = []
        }
    }

    /// The partitions revoked during the poll that just ended, those of them assigned to this member again by a
    /// later rebalance of the same poll, and all those newly assigned (assigned still).
    func endPoll() -> (revoked: Set<KafkaTopicPartition>, reassigned: Set<KafkaTopicPartition>,
                       assigned: Set<KafkaTopicPartition>) {
        state.withLock { s in
            let assigned = s.assignedDuringPoll.filter { s.tracks[$0] != nil }
            return (s.revokedDuringPoll, s.revokedDuringPoll.intersection(assigned), assigned)
        }
    }

    /// Where reading starts on partitions that have received nothing yet (`PartitionOffsets.expect(from:)`).
    func expect(_ starts: [KafkaTopicPartition: Int64]) {
        state.withLock { s in
            for (partition, start) in starts { s.tracks[partition]?.offsets.expect(from: start) }
        }
    }

    /// The partitions' logs now start at these offsets: missing offsets below them were deleted before they were
    /// read again (`PartitionOffsets.logStarts(at:)`). Returns how many each partition lost.
    func logStarts(_ starts: [KafkaTopicPartition: Int64]) -> [KafkaTopicPartition: Int64] {
        state.withLock { s in
            var lost: [KafkaTopicPartition: Int64] = [:]
            for (partition, start) in starts {
                guard var track = s.tracks[partition] else { continue }
                let gone = track.offsets.logStarts(at: start)
                guard gone > 0 else { continue }
                lost[partition] = gone
                if track.offsets.missing.isEmpty { track.rereadDue = nil }
                s.tracks[partition] = track
            }
            if !lost.isEmpty { metrics.offsetsMissing.set(Self.missingCount(s)) }
            return lost
        }
    }

    /// Runs on the consumer's thread during `poll`: must not wait on the consumer. Returns, for revoked partitions,
    /// where their settled jobs end, to be committed before they go: the next owner then starts after them, not at
    /// the last periodic commit.
    func rebalance(_ event: KafkaRebalanceEvent) -> [KafkaTopicPartitionOffset] {
        switch event {
        case .assigned(let partitions):
            state.withLock { s in
                s.joined = true
                for partition in partitions where s.tracks[partition] == nil {
                    s.generation += 1
                    s.tracks[partition] = Track(generation: s.generation)
                    s.assignedDuringPoll.insert(partition)
                }
                metrics.partitionsAssigned.set(Int64(s.tracks.count))
            }
            return []
        case .revoked(let partitions):
            let (cancelled, settled) = state.withLock { s -> ([Task<Void, Never>], [KafkaTopicPartitionOffset]) in
                var tasks: [Task<Void, Never>] = []
                var settled: [KafkaTopicPartitionOffset] = []
                s.revokedDuringPoll.formUnion(partitions)
                for partition in partitions {
                    guard let track = s.tracks.removeValue(forKey: partition) else { continue }
                    if let offset = track.offsets.uncommitted {
                        settled.append(KafkaTopicPartitionOffset(topic: partition.topic, partition: partition.partition,
                                                                 offset: offset))
                    }
                    tasks += track.tasks.values
                    // Their jobs no longer count against the limit; they end quickly once cancelled.
                    s.inFlight -= track.tasks.count
                }
                metrics.partitionsAssigned.set(Int64(s.tracks.count))
                metrics.inFlightJobs.set(Int64(s.inFlight))
                metrics.offsetsMissing.set(Self.missingCount(s))
                return (tasks, settled)
            }
            for task in cancelled { task.cancel() }
            return settled
        }
    }

    /// Registers the record and starts its job via `make`, given the partition's generation and the previous job
    /// of the same key (which the new job must wait for). Records of partitions not assigned (any more) are
    /// dropped: their next owner reads them from the committed offset. A record received before (a re-read after
    /// a gap delivers it again) is dropped too. Offsets the record skips over are counted and scheduled to be read
    /// again at once (see `rereadsDue`).
    func start(_ record: KafkaRecord, make: (_ generation: Int, _ previous: Task<Void, Never>?) -> Task<Void, Never>) {
        let partition = KafkaTopicPartition(topic: record.topic, partition: record.partition)
        let gap = state.withLock { s -> (from: Int64, count: Int64)? in
            guard var track = s.tracks[partition] else { return nil }
            let missingBefore = !track.offsets.missing.isEmpty
            let admission = track.offsets.receive(record.offset)
            guard admission != .duplicate else { return nil }
            let key = record.key ?? []
            let task = make(track.generation, track.tails[key]?.task)
            track.tails[key] = (record.offset, task)
            track.queued[key, default: 0] += 1
            track.tasks[record.offset] = task
            var gap: (from: Int64, count: Int64)?
            if case .startAfterGap(let from, let count) = admission {
                gap = (from, count)
                track.rereadDue = .now
                track.rereadBackoff = Self.firstRereadBackoff
            } else if missingBefore, track.offsets.missing.isEmpty {
                track.rereadDue = nil
            }
            s.tracks[partition] = track
            s.inFlight += 1
            metrics.inFlightJobs.set(Int64(s.inFlight))
            if gap != nil || missingBefore { metrics.offsetsMissing.set(Self.missingCount(s)) }
            return gap
        }
        if let gap { metrics.offsetGaps.increment(by: UInt64(gap.count)) }
    }

    private static func missingCount(_ s: State) -> Int64 {
        s.tracks.values.reduce(0) { sum, track in sum + track.offsets.missing.reduce(0) { $0 + Int64($1.count) } }
    }

    /// The partitions whose missing offsets are due to be read again, each with its oldest missing offset; the
    /// next re-read of each is scheduled after its backoff.
    func rereadsDue(now: ContinuousClock.Instant = .now) -> [KafkaTopicPartitionOffset] {
        state.withLock { s in
            var due: [KafkaTopicPartitionOffset] = []
            for (partition, var track) in s.tracks {
                guard let at = track.rereadDue, at <= now, let offset = track.offsets.firstMissing else { continue }
                due.append(KafkaTopicPartitionOffset(topic: partition.topic, partition: partition.partition, offset: offset))
                track.rereadDue = now + track.rereadBackoff
                track.rereadBackoff = min(track.rereadBackoff * 2, Self.maxRereadBackoff)
                s.tracks[partition] = track
            }
            return due
        }
    }

    /// True when some offsets of the partition are missing (`rereadsDue`).
    func isMissingOffsets(_ partition: KafkaTopicPartition) -> Bool {
        state.withLock { $0.tracks[partition].map { !$0.offsets.missing.isEmpty } ?? false }
    }

    func finish(_ record: KafkaRecord, generation: Int, settled: Bool) {
        let partition = KafkaTopicPartition(topic: record.topic, partition: record.partition)
        state.withLock { s in
            guard var track = s.tracks[partition], track.generation == generation else { return }
            if settled { track.offsets.settle(record.offset) }
            let key = record.key ?? []
            if track.tails[key]?.offset == record.offset { track.tails[key] = nil }
            if track.tasks.removeValue(forKey: record.offset) != nil {
                s.inFlight -= 1
                track.queued[key] = track.queued[key].flatMap { $0 > 1 ? $0 - 1 : nil }
            }
            s.tracks[partition] = track
            metrics.inFlightJobs.set(Int64(s.inFlight))
        }
    }

    /// Jobs of `record`'s key in its partition started and not finished.
    func queuedJobs(ofKeyOf record: KafkaRecord) -> Int {
        let partition = KafkaTopicPartition(topic: record.topic, partition: record.partition)
        return state.withLock { $0.tracks[partition]?.queued[record.key ?? []] ?? 0 }
    }

    /// Records that `partition` is paused for `key`'s queue.
    func paused(_ partition: KafkaTopicPartition, for key: [UInt8]) {
        state.withLock { $0.tracks[partition]?.pausedFor = key }
    }

    /// The partitions paused for a busy key.
    func pausedPartitions() -> Set<KafkaTopicPartition> {
        state.withLock { s in Set(s.tracks.compactMap { $0.value.pausedFor == nil ? nil : $0.key }) }
    }

    /// The paused partitions whose key has fewer than `below` jobs left, no longer marked paused (`paused(_:for:)`
    /// again if resuming them fails).
    func resumable(below: Int) -> [(partition: KafkaTopicPartition, key: [UInt8])] {
        state.withLock { s in
            var ready: [(partition: KafkaTopicPartition, key: [UInt8])] = []
            for (partition, track) in s.tracks {
                guard let key = track.pausedFor, track.queued[key] ?? 0 < below else { continue }
                s.tracks[partition]?.pausedFor = nil
                ready.append((partition, key))
            }
            return ready
        }
    }

    func cancelAll() {
        let tasks = state.withLock { s in s.tracks.values.flatMap { $0.tasks.values } }
        for task in tasks { task.cancel() }
    }

    func uncommitted() -> [KafkaTopicPartitionOffset] {
        state.withLock { s in
            s.tracks.compactMap { partition, track in
                track.offsets.uncommitted.map {
                    KafkaTopicPartitionOffset(topic: partition.topic, partition: partition.partition, offset: $0)
                }
            }
        }
    }

    func committed(_ positions: [KafkaTopicPartitionOffset]) {
        state.withLock { s in
            for position in positions {
                s.tracks[position.topicPartition]?.offsets.committed = position.offset
            }
        }
    }
}
