/// What a group consumer does when its fetches come back empty although the broker holds more records: the
/// consumer is replaced by one with a longer fetch wait.
///
/// Kafka itself never does this, so recovery is off unless configured. Tansu (the development broker) does:
/// it answers a fetch with no records, and no error, once looking the fetch offset up outlasts the fetch's
/// `max_wait_ms`, and that lookup grows with the partition's length. The local stack, the tests and the soak turn
/// recovery on.
public struct FetchStallRecovery: Sendable, Hashable {
    /// A partition whose position has not moved for this long while the broker reports more records is stalled.
    public var stallTimeout: Duration
    /// Each replacement's fetch wait is the previous one times this factor…
    public var fetchWaitGrowth: Int
    /// …up to this.
    public var maxFetchWait: Duration

    public init(stallTimeout: Duration, fetchWaitGrowth: Int = 4, maxFetchWait: Duration = .seconds(2)) {
        self.stallTimeout = stallTimeout
        self.fetchWaitGrowth = fetchWaitGrowth
        self.maxFetchWait = maxFetchWait
    }

    /// The fetch wait of the consumer that replaces a stalled one that used `fetchWait`.
    public func replacementFetchWait(after fetchWait: Duration) -> Duration {
        min(fetchWait * fetchWaitGrowth, maxFetchWait)
    }
}

/// Notices partitions the consumer no longer receives records from although the broker holds more (see
/// `FetchStallRecovery`). A partition counts as stalled when its lag stays above 0 while its position does not
/// move for `stallTimeout`.
public struct FetchWatchdog: Sendable {
    public let stallTimeout: Duration
    /// Per lagging partition: its position and since when it has not moved.
    private var unmoved: [KafkaTopicPartition: (position: Int64, since: ContinuousClock.Instant)] = [:]
    /// When the consumer was last replaced, until it receives a record.
    private var replacedAt: ContinuousClock.Instant?

    public init(stallTimeout: Duration) { self.stallTimeout = stallTimeout }

    /// Takes a new reading and returns the partitions stalled for `stallTimeout` or longer.
    public mutating func stalled(_ progress: [KafkaPartitionProgress],
                                 now: ContinuousClock.Instant) -> [KafkaPartitionProgress] {
        var next: [KafkaTopicPartition: (position: Int64, since: ContinuousClock.Instant)] = [:]
        var stalled: [KafkaPartitionProgress] = []
        for entry in progress where entry.lag > 0 {
            let previous = unmoved[entry.partition]
            let since = previous?.position == entry.position ? previous?.since ?? now : now
            next[entry.partition] = (entry.position, since)
            if now - since >= stallTimeout { stalled.append(entry) }
        }
        unmoved = next
        return stalled
    }

    /// Forgets every reading: the consumer was replaced at `now` because of a stall, so records are left and the
    /// new one must receive some.
    public mutating func replaced(at now: ContinuousClock.Instant) {
        unmoved = [:]
        replacedAt = now
    }

    /// The consumer received records.
    public mutating func recordsArrived() { replacedAt = nil }

    /// Forgets the positions read so far: the caller held them back on purpose (it had no room for records).
    public mutating func forgetReadings() { unmoved = [:] }

    /// True when a consumer that replaced a stalled one has received nothing for twice the stall timeout and the
    /// broker has not said that nothing is left: its positions and watermarks can stay unknown while no fetch
    /// returns records, so `stalled` cannot judge it. When every assigned partition is known to be read to its end
    /// (or none is assigned: the group gave them to other members), nothing was left for it to receive, and it is
    /// no longer watched as a replacement; else an idle topic would have it replaced again and again, each time a
    /// rebalance of the whole group.
    public mutating func silentSinceReplacement(_ progress: [KafkaPartitionProgress],
                                                now: ContinuousClock.Instant) -> Bool {
        guard let replacedAt, now - replacedAt >= stallTimeout * 2 else { return false }
        if progress.allSatisfy({ $0.position >= 0 && $0.highWatermark >= 0 && $0.lag == 0 }) {
            self.replacedAt = nil
            return false
        }
        return true
    }
}
