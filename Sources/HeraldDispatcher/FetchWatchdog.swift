import HeraldKafka

/// Notices partitions the consumer no longer receives records from although the broker holds more.
///
/// Tansu (the development broker) answers a fetch with no records when looking the fetch offset up in its
/// in-memory storage takes longer than the fetch's `max_wait_ms`, and that lookup grows with the partition's length:
/// past some size every fetch comes back empty, with no error, for ever. A partition counts as stalled when its
/// lag stays above 0 while its position does not move for `stallTimeout`.
struct FetchWatchdog: Sendable {
    let stallTimeout: Duration
    /// Per lagging partition: its position and since when it has not moved.
    private var unmoved: [KafkaTopicPartition: (position: Int64, since: ContinuousClock.Instant)] = [:]
    /// When the consumer was last replaced, until it receives a record.
    private var replacedAt: ContinuousClock.Instant?

    init(stallTimeout: Duration) { self.stallTimeout = stallTimeout }

    /// Takes a new reading and returns the partitions stalled for `stallTimeout` or longer.
    mutating func stalled(_ progress: [KafkaPartitionProgress], now: ContinuousClock.Instant) -> [KafkaPartitionProgress] {
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
    mutating func replaced(at now: ContinuousClock.Instant) {
        unmoved = [:]
        replacedAt = now
    }

    /// The consumer received records.
    mutating func recordsArrived() { replacedAt = nil }

    /// True when a consumer that replaced a stalled one has received nothing for twice the stall timeout. Its
    /// positions and the broker's watermarks stay unknown while no fetch returns records, so `stalled` cannot
    /// judge it.
    func silentSinceReplacement(now: ContinuousClock.Instant) -> Bool {
        replacedAt.map { now - $0 >= stallTimeout * 2 } ?? false
    }
}
