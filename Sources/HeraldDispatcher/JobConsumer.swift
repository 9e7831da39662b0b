// Over 400 lines: the group member's fetch loop (polls, rebalances, rewinds, gaps, busy keys, stall replacement, drain) is one state machine over one consumer; the offsets' bookkeeping is PartitionBook's.
import Foundation
import HeraldKafka
import HeraldRuntime

/// The consumer-group member on the jobs topic: fetches records, runs each as a job, and commits offsets only
/// up to the oldest unsettled job of each partition. Its fetch loop moves through named phases (`Phase`):
/// fetching ⇄ full, fetching → replacing → fetching, and from any of them draining → closed.
///
/// Ordering: jobs with the same record key (one target: a channel, a post, a device) run one after another in
/// offset order; jobs of other keys, in the same or another partition, run concurrently, up to
/// `maxInFlightJobs`. A key with `maxJobsPerKey` jobs under way pauses its partition at its next record until
/// fewer than half of them are left: a busy key (a hot channel whose fan-outs outlast the gaps between its events,
/// a device whose pushes APNs throttles) holds up its own partition, never the others. A revoked partition's jobs are
/// cancelled (their fan-out progress stays in Redis for the next owner); their offsets are not committed.
///
/// With `fetchStallRecovery` configured, a stalled consumer (see `FetchWatchdog`) is replaced by one with a longer
/// fetch wait, which leaves and rejoins the group; its partitions' unsettled jobs are handed back like on a
/// rebalance.
final class JobConsumer: Service {
    /// Replaced only by the fetch loop (`restartConsumer`); the committer and the drain read it.
    private let current: Lock<KafkaConsumer>
    private var consumer: KafkaConsumer { current.withLock { $0 } }
    private let book: PartitionBook
    private let runner: JobRunner
    private let configuration: DispatcherConfiguration
    private let metrics: DispatcherMetrics
    private let logger: Logger
    private let slotFreed = SlotSignal()
    private let lastCommit = Lock<Task<Void, Never>?>(nil)

    init(configuration: DispatcherConfiguration, runner: JobRunner, metrics: DispatcherMetrics,
         logger: Logger) throws(KafkaError) {
        let book = PartitionBook(metrics: metrics)
        self.book = book
        self.runner = runner
        self.configuration = configuration
        self.metrics = metrics
        self.logger = logger
        current = Lock(try Self.makeConsumer(configuration: configuration, fetchWait: configuration.fetchMaxWait,
                                             book: book, logger: logger))
    }

    private static func makeConsumer(configuration: DispatcherConfiguration, fetchWait: Duration, book: PartitionBook,
                                     logger: Logger) throws(KafkaError) -> KafkaConsumer {
        var configuration = configuration
        configuration.fetchMaxWait = fetchWait
        return try KafkaConsumer(configuration: configuration.consumer, logger: logger.with(["component": "kafka"]),
                                 onRebalance: { event in book.rebalance(event) })
    }

    /// The group has given this member its assignment (possibly empty), so it can deliver: the dispatcher's
    /// readiness. Joining takes a rebalance, seconds after start.
    var joinedGroup: Bool { book.joined }

    /// Where the fetch loop is. It starts `fetching` and ends `closed`; cancellation or a fatal consumer error
    /// sends it to `draining` from wherever it is.
    enum Phase {
        /// Polls and dispatches what arrives.
        case fetching
        /// `maxInFlightJobs` are running: waits for one to settle (at most 200 ms, so rebalances are still served).
        case full
        /// The fetch watchdog found the consumer stalled: it is replaced by one with a longer fetch wait.
        case replacing(stalled: [KafkaPartitionProgress], fetchWait: Duration)
        /// Waits up to `drainTimeout` for in-flight jobs, cancels the rest, commits what settled, leaves the group.
        case draining(failure: (any Error)?)
        case closed
    }

    /// Runs the phases until cancelled, then drains. (`OffsetCommitter` commits meanwhile.)
    func run() async throws {
        try await consumer.subscribe(topics: [configuration.jobsTopic])
        var fetch = FetchState(configuration: configuration)
        var phase = Phase.fetching
        while true {
            switch phase {
            case .fetching, .full, .replacing:
                guard !Task.isCancelled else {
                    phase = .draining(failure: nil)
                    continue
                }
                do {
                    phase = try await step(from: phase, &fetch)
                } catch {
                    // Fatal consumer errors only (transient ones are logged inside poll): drain, then exit.
                    phase = .draining(failure: Task.isCancelled ? nil : error)
                }
            case .draining(let failure):
                // In a fresh task, since sleeps and waits return at once in a cancelled one.
                await Task { await self.drain() }.value
                phase = .closed
                if let failure { throw failure }
            case .closed:
                return
            }
        }
    }

    /// One step of a running phase; returns the next phase.
    private func step(from phase: Phase, _ fetch: inout FetchState) async throws -> Phase {
        switch phase {
        case .full:
            await slotFreed.wait(upTo: .milliseconds(200))
            return .fetching
        case .replacing(let stalled, let longer):
            try await restartConsumer(stalled: stalled, fetchWait: longer, fetch: &fetch)
            return .fetching
        case .fetching:
            return try await fetchOnce(&fetch)
        case .draining, .closed:
            return phase
        }
    }

    /// One poll: dispatches what arrived and says what comes next.
    private func fetchOnce(_ fetch: inout FetchState) async throws -> Phase {
        try await resumeQuietKeys()
        let room = configuration.maxInFlightJobs - book.inFlight
        book.beginPoll()
        // Still full, the poll is for the group's sake (rebalances, membership) and asks for one record.
        var records = try await poll(maxRecords: max(1, room), fetch: fetch)
        let (revoked, reassigned, assigned) = book.endPoll()
        if let gap = configuration.injectedOffsetGap { records = fetch.leaveOut(gap, from: records, assigned: assigned) }
        fetch.received(records.count)
        // Records of a partition revoked during this poll are dropped with the old assignment's: whoever owns it now
        // reads them again from the committed offset. When that is this member, its new fetch may have returned some
        // already, so it seeks back there too, and runs none of the partition's records until that seek succeeded.
        var dropped: Set<KafkaTopicPartition> = []
        if !revoked.isEmpty {
            records.removeAll { record in
                let partition = KafkaTopicPartition(topic: record.topic, partition: record.partition)
                guard revoked.contains(partition) else { return false }
                dropped.insert(partition)
                return true
            }
        }
        fetch.rewind(dropped.intersection(reassigned), revoked: revoked)
        if !fetch.rewindsPending.isEmpty {
            records.removeAll { fetch.rewindsPending.contains(KafkaTopicPartition(topic: $0.topic, partition: $0.partition)) }
            if fetch.rewindDue(now: .now) { try await rewindToCommitted(&fetch) }
        }
        await expectCommitted(assigned)
        if room <= 0, await handBack(records) {
            fetch.heldBack()
            return .full
        }
        try await dispatchPausingBusyKeys(records)
        try await rereadMissing()
        if fetch.checkDue(now: .now), let recovery = fetch.recovery {
            // A partition paused for a busy key does not move on purpose: it is no stall.
            let paused = book.pausedPartitions()
            let progress = try await consumer.progress().filter { !paused.contains($0.partition) }
            if let stalled = fetch.stalled(progress, now: .now) {
                return .replacing(stalled: stalled, fetchWait: recovery.replacementFetchWait(after: fetch.wait))
            }
        }
        return book.inFlight >= configuration.maxInFlightJobs ? .full : .fetching
    }

    /// Moves the partitions pending a rewind back to the committed offsets (the beginning where none is, as
    /// `auto.offset.reset` would). A refusal that is not fatal (coordinator moving, timeout) is retried a second later.
    private func rewindToCommitted(_ fetch: inout FetchState) async throws {
        do {
            let positions = try await consumer.committed(Array(fetch.rewindsPending)).map { position in
                var position = position
                if position.offset < 0 { position.offset = KafkaTopicPartitionOffset.beginning }
                return position
            }
            logger.warning("records fetched across a rebalance were dropped; reading them again from the committed offsets",
                           ["kafka.partitions": positions.map { "\($0.partition)@\($0.offset)" }.joined(separator: ",")])
            try await consumer.seek(positions)
            fetch.rewound(true, now: .now)
        } catch {
            guard !error.isFatal else { throw error }
            logger.warning("cannot move partitions back to their committed offsets; will retry", ["error": "\(error)"])
            fetch.rewound(false, now: .now)
        }
    }

    /// Tells the book where reading starts on newly assigned partitions (the committed offset, while the log still
    /// has it), so that records a first fetch leaves out are read again like later ones. Without an answer
    /// (logged), their first record sets it.
    private func expectCommitted(_ partitions: Set<KafkaTopicPartition>) async {
        guard !partitions.isEmpty else { return }
        do {
            let committed = try await consumer.committed(Array(partitions)).filter { $0.offset >= 0 }
            guard !committed.isEmpty else { return }
            // Below the log start (retention passed the group), the consumer starts where `auto.offset.reset` says.
            let logStarts = try await consumer.logStartOffsets(committed.map(\.topicPartition))
            book.expect(Dictionary(committed.compactMap { position in
                logStarts[position.topicPartition].flatMap { position.offset >= $0 ? (position.topicPartition, position.offset) : nil }
            }, uniquingKeysWith: max))
        } catch {
            logger.warning("cannot read where newly assigned partitions start; a record left out of their first fetch "
                           + "would go unnoticed", ["error": "\(error)"])
        }
    }

    /// With no room for them, moves the partitions of `records` back to them, to be read again later, so the jobs
    /// in flight stay within `maxInFlightJobs`. False when the consumer refused (logged): they run, over the limit.
    private func handBack(_ records: [KafkaRecord]) async -> Bool {
        guard !records.isEmpty else { return true }
        do {
            try await consumer.seek(records.map {
                KafkaTopicPartitionOffset(topic: $0.topic, partition: $0.partition, offset: $0.offset)
            })
            return true
        } catch {
            logger.warning("cannot hand a record back while the dispatcher is full; running it over the limit",
                           ["error": "\(error)"])
            return false
        }
    }

    /// Dispatches `records` in order, but from the first record whose key has `maxJobsPerKey` jobs under way, its
    /// partition's records go back: the partition is moved back to that record and paused (`resumeQuietKeys`).
    /// When the consumer refuses the seek, they run all the same, over the key's limit (logged).
    private func dispatchPausingBusyKeys(_ records: [KafkaRecord]) async throws {
        var held: [KafkaTopicPartition: [KafkaRecord]] = [:]
        for record in records {
            let partition = KafkaTopicPartition(topic: record.topic, partition: record.partition)
            if held[partition] != nil || book.queuedJobs(ofKeyOf: record) >= configuration.maxJobsPerKey {
                held[partition, default: []].append(record)
            } else {
                dispatch(record)
            }
        }
        guard !held.isEmpty else { return }
        let firsts = held.values.map { $0[0] }
        do {
            try await consumer.seek(firsts.map {
                KafkaTopicPartitionOffset(topic: $0.topic, partition: $0.partition, offset: $0.offset)
            })
        } catch {
            guard !error.isFatal else { throw error }
            logger.warning("cannot pause a partition for its busy key; running its jobs over the key's limit",
                           ["error": "\(error)"])
            for record in held.values.joined() { dispatch(record) }
            return
        }
        for first in firsts {
            book.paused(KafkaTopicPartition(topic: first.topic, partition: first.partition), for: first.key ?? [])
        }
        do { try await consumer.pause(Array(held.keys)) } catch {
            guard !error.isFatal else { throw error }
            // Not paused, the partition is fetched again from the record and held back again: more fetches, no loss.
            logger.warning("cannot pause a partition for its busy key", ["error": "\(error)"])
        }
        metrics.pausesForBusyKeys.increment(by: UInt64(held.count))
    }

    /// Resumes the partitions paused for a key that now has fewer than half of `maxJobsPerKey` jobs under way.
    private func resumeQuietKeys() async throws {
        let ready = book.resumable(below: max(1, configuration.maxJobsPerKey / 2))
        guard !ready.isEmpty else { return }
        do { try await consumer.resume(ready.map(\.partition)) } catch {
            guard !error.isFatal else { throw error }
            logger.warning("cannot resume a partition paused for a busy key; will retry", ["error": "\(error)"])
            for (partition, key) in ready { book.paused(partition, for: key) }
        }
    }

    /// Seeks partitions whose fetches skipped offsets back to the oldest one missing, so the records left out
    /// are read again; what was received already is dropped as it comes round again (see `PartitionBook.start`).
    private func rereadMissing() async throws {
        var due = book.rereadsDue()
        guard !due.isEmpty else { return }
        // Offsets the broker has deleted since (retention) can never be read: they stop holding commits back.
        if let starts = try? await consumer.logStartOffsets(due.map(\.topicPartition)) {
            let lost = book.logStarts(starts)
            if !lost.isEmpty {
                metrics.offsetsExpired.increment(by: UInt64(lost.values.reduce(0, +)))
                logger.error("records left out of a fetch were deleted (retention) before they could be read again; "
                             + "their jobs may never have run", [
                    "kafka.partitions": lost.map { "\($0.key)@\(starts[$0.key]!)-\($0.value)" }.sorted().joined(separator: ","),
                ])
                due = due.compactMap { position in
                    guard let start = starts[position.topicPartition], start > position.offset else { return position }
                    guard book.isMissingOffsets(position.topicPartition) else { return nil }
                    var position = position
                    position.offset = start
                    return position
                }
                guard !due.isEmpty else { return }
            }
        }
        logger.warning("a fetch skipped offsets; reading them again before committing past them", [
            "kafka.partitions": due.map { "\($0.partition)@\($0.offset)" }.joined(separator: ","),
        ])
        metrics.rereads.increment(by: UInt64(due.count))
        do {
            try await consumer.seek(due)
        } catch {
            guard !error.isFatal else { throw error }
            // The partition may have been revoked meanwhile; a kept gap is tried again after its backoff.
            logger.warning("seeking back to missing offsets failed; will retry", ["error": "\(error)"])
        }
    }

    /// One poll of the consumer, or, while a test's injected stall applies, an empty answer after the poll's time.
    private func poll(maxRecords: Int, fetch: FetchState) async throws -> [KafkaRecord] {
        let timeout = Duration.milliseconds(100)
        if let stall = configuration.injectedFetchStall, stall.applies(fetchWait: fetch.wait, received: fetch.receivedByConsumer) {
            try await Task.sleep(for: timeout)
            return []
        }
        return try await consumer.poll(maxRecords: maxRecords, timeout: timeout)
    }

    /// Replaces the consumer with one whose fetch wait is longer (a fetch wait cannot change on a live one).
    private func restartConsumer(stalled: [KafkaPartitionProgress], fetchWait longer: Duration,
                                 fetch: inout FetchState) async throws {
        metrics.fetchStalls.increment()
        logger.warning("no records fetched although the broker has more; restarting the consumer with a longer fetch wait", [
            "kafka.partitions": stalled.isEmpty ? "none received since the last replacement"
                : stalled.map { "\($0.partition)@\($0.position)/\($0.highWatermark)" }.joined(separator: ","),
            "kafka.fetch_wait_ms": "\(fetch.wait.inMilliseconds)",
            "kafka.new_fetch_wait_ms": "\(longer.inMilliseconds)",
        ])
        // Jobs under way finish first, as on shutdown: leaving the group hands back what is unsettled, and its
        // next run repeats the pushes sent since its last saved progress.
        await settleInFlight(until: .now + configuration.drainTimeout)
        book.leaving()
        do { try await consumer.close() } catch {
            logger.warning("leaving the consumer group failed", ["error": "\(error)"])
        }
        let replacement = try Self.makeConsumer(configuration: configuration, fetchWait: longer, book: book, logger: logger)
        current.withLock { $0 = replacement }
        try await replacement.subscribe(topics: [configuration.jobsTopic])
        fetch.replaced(fetchWait: longer, at: .now)
    }

    /// Waits until no job is in flight or `deadline` passes, committing what settles meanwhile.
    private func settleInFlight(until deadline: ContinuousClock.Instant) async {
        while book.inFlight > 0, ContinuousClock.now < deadline {
            await slotFreed.wait(upTo: .milliseconds(100))
            await commit()
        }
        await commit()
    }

    private func drain() async {
        logger.info("draining", ["jobs.in_flight": "\(book.inFlight)"])
        await settleInFlight(until: .now + configuration.drainTimeout)
        if book.inFlight > 0 {
            logger.warning("handing back unfinished jobs", ["jobs.in_flight": "\(book.inFlight)"])
            book.cancelAll()
            let cancelDeadline = ContinuousClock.now + .seconds(3)
            while book.inFlight > 0, ContinuousClock.now < cancelDeadline { await slotFreed.wait(upTo: .milliseconds(50)) }
        }
        await commit()
        book.leaving()
        do { try await consumer.close() } catch {
            logger.warning("leaving the consumer group failed", ["error": "\(error)"])
        }
        logger.info("consumer closed")
    }

    private func dispatch(_ record: KafkaRecord) {
        let runner = self.runner, book = self.book, slotFreed = self.slotFreed
        book.start(record) { generation, previous in
            Task {
                // One target's jobs run in offset order.
                await previous?.value
                let settled = Task.isCancelled ? false : await runner.run(record)
                book.finish(record, generation: generation, settled: settled)
                slotFreed.signal()
            }
        }
    }

    /// Commits every partition's offset up to its oldest unsettled job. Commits run one after another (the
    /// committer's and the drain's), so an older position never lands after a newer one.
    func commit() async {
        let commit = lastCommit.withLock { last -> Task<Void, Never> in
            let previous = last
            last = Task { [self] in
                await previous?.value
                await commitSettled()
            }
            return last!
        }
        await commit.value
    }

    private func commitSettled() async {
        let book = self.book
        // Nothing to commit (also once the consumer is closed): no commit, counted neither way.
        guard !book.uncommitted().isEmpty else { return }
        do {
            let positions = try await consumer.commit { book.uncommitted() }
            guard !positions.isEmpty else { return }
            book.committed(positions)
            metrics.commits.labels("ok").increment()
        } catch {
            metrics.commits.labels("failed").increment()
            logger.warning("offset commit failed; will retry", ["error": "\(error)"])
        }
    }
}

/// Wakes the fetch loop when a job settles.
final class SlotSignal: Sendable {
    private let state = Lock<(next: UInt64, waiters: [UInt64: CheckedContinuation<Void, Never>])>((0, [:]))

    func signal() {
        let all = state.withLock { s in
            defer { s.waiters = [:] }
            return Array(s.waiters.values)
        }
        for waiter in all { waiter.resume() }
    }

    /// Returns at the next `signal()` or after `timeout`, whichever comes first.
    func wait(upTo timeout: Duration) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let id = state.withLock { s in
                s.next += 1
                s.waiters[s.next] = continuation
                return s.next
            }
            DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(Int(timeout.inNanoseconds))) { [self] in
                // Still waiting unless a signal resumed it first.
                state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
            }
        }
    }
}

/// Commits the consumer's settled offsets every `interval`, beside the fetch loop, so that waiting for the
/// broker's answer never delays fetching. Stopped after the consumer, whose drain makes the last commit.
struct OffsetCommitter: Service {
    let consumer: JobConsumer
    let interval: Duration

    func run() async {
        while !Task.isCancelled {
            try? await Task.sleep(for: interval)
            await consumer.commit()
        }
    }
}
