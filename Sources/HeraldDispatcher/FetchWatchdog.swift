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

    /// Forgets every reading (after the consumer was replaced).
    mutating func reset() { unmoved = [:] }
}
