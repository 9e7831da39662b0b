import HeraldKafka
import HeraldRuntime

/// The fetch loop's own state: the fetch wait of the consumer in use, what it received, the partitions still to be
/// moved back to their committed offsets, and, with stall recovery configured, the watchdog's readings (taken
/// once a second).
struct FetchState {
    let recovery: FetchStallRecovery?
    private(set) var wait: Duration
    private(set) var receivedByConsumer = 0
    private var watchdog: FetchWatchdog?
    private var nextCheck = ContinuousClock.now + .seconds(1)

    init(configuration: DispatcherConfiguration) {
        recovery = configuration.fetchStallRecovery
        wait = configuration.fetchMaxWait
        watchdog = recovery.map { FetchWatchdog(stallTimeout: $0.stallTimeout) }
    }

    mutating func received(_ count: Int) {
        guard count > 0 else { return }
        receivedByConsumer += count
        watchdog?.recordsArrived()
    }

    /// The fetch loop holds positions back while full: they did not move because it did not take records, so
    /// the watchdog starts its readings again.
    mutating func heldBack() { watchdog?.forgetReadings() }

    /// True once a second when stall recovery is on.
    mutating func checkDue(now: ContinuousClock.Instant) -> Bool {
        guard watchdog != nil, now >= nextCheck else { return false }
        nextCheck = now + .seconds(1)
        return true
    }

    /// The stalled partitions when the consumer must be replaced (empty when a replacement received nothing
    /// yet), nil when it need not.
    mutating func stalled(_ progress: [KafkaPartitionProgress], now: ContinuousClock.Instant) -> [KafkaPartitionProgress]? {
        guard var watchdog else { return nil }
        defer { self.watchdog = watchdog }
        let stalled = watchdog.stalled(progress, now: now)
        return !stalled.isEmpty || watchdog.silentSinceReplacement(progress, now: now) ? stalled : nil
    }

    /// Records a test's injected gap left out already: each only once, so reading it again finds it.
    private var leftOut: Set<KafkaTopicPartitionOffset> = []
    /// Partitions assigned that have received no record since (for `InjectedOffsetGap.firstAfterAssignment`).
    private var awaitingFirstRecord: Set<KafkaTopicPartition> = []

    /// Leaves out, once each, the records `gap` selects: a gap as Tansu leaves now and then.
    mutating func leaveOut(_ gap: InjectedOffsetGap, from records: [KafkaRecord],
                           assigned: Set<KafkaTopicPartition>) -> [KafkaRecord] {
        if gap.firstAfterAssignment { awaitingFirstRecord.formUnion(assigned) }
        let last = Dictionary(records.map { ($0.partition, $0.offset) }, uniquingKeysWith: max)
        return records.filter { record in
            let first = awaitingFirstRecord.remove(KafkaTopicPartition(topic: record.topic, partition: record.partition)) != nil
            guard record.offset > 0, first || gap.every.map({ record.offset % $0 == 0 && record.offset < last[record.partition]! }) == true
            else { return true }
            let position = KafkaTopicPartitionOffset(topic: record.topic, partition: record.partition, offset: record.offset)
            return !leftOut.insert(position).inserted
        }
    }

    /// Partitions whose records fetched across a rebalance were dropped and which must be read again from the
    /// committed offset before any more of their records run. They stay here until the seek succeeds.
    private(set) var rewindsPending: Set<KafkaTopicPartition> = []
    /// After a failed seek: when to try again.
    private var rewindRetry: ContinuousClock.Instant?

    /// After a poll: revoked partitions need no rewind any more (whoever is assigned them next starts from the
    /// committed offset); `dropped` ones, assigned to this member again, do.
    mutating func rewind(_ dropped: Set<KafkaTopicPartition>, revoked: Set<KafkaTopicPartition>) {
        rewindsPending.subtract(revoked)
        rewindsPending.formUnion(dropped)
        if !dropped.isEmpty { rewindRetry = nil }
    }

    /// True when a rewind is pending and the last failed attempt was at least a second ago.
    func rewindDue(now: ContinuousClock.Instant) -> Bool {
        !rewindsPending.isEmpty && rewindRetry.map { now >= $0 } ?? true
    }

    mutating func rewound(_ succeeded: Bool, now: ContinuousClock.Instant) {
        if succeeded { rewindsPending = [] }
        rewindRetry = succeeded ? nil : now + .seconds(1)
    }

    mutating func replaced(fetchWait: Duration, at now: ContinuousClock.Instant) {
        wait = fetchWait
        receivedByConsumer = 0
        // The new consumer joins the group afresh and starts every partition from its committed offset.
        rewindsPending = []
        watchdog?.replaced(at: now)
    }
}
