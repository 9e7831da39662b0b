/// The offsets of one partition that are started but not settled, and what may be committed.
///
/// Jobs of a partition may settle out of order (jobs of different targets run concurrently); the commit
/// position is the oldest unsettled offset, so a commit never passes an unsettled job.
struct PartitionOffsets: Sendable, Equatable {
    /// Started and unsettled, ascending.
    private(set) var pending: [Int64] = []
    /// One past the highest offset started.
    private(set) var next: Int64?
    /// The last position the broker acknowledged for the group.
    var committed: Int64?

    mutating func start(_ offset: Int64) {
        if let last = pending.last, offset < last {
            pending.insert(offset, at: pending.firstIndex { $0 > offset } ?? pending.endIndex)
        } else {
            pending.append(offset)
        }
        next = max(next ?? offset + 1, offset + 1)
    }

    mutating func settle(_ offset: Int64) {
        if let index = pending.firstIndex(of: offset) { pending.remove(at: index) }
    }

    /// The next offset to read once everything settled so far is committed: the oldest unsettled offset, or
    /// one past the highest started when none is unsettled.
    var commitPosition: Int64? { pending.first ?? next }

    /// A position to commit that the broker does not have yet.
    var uncommitted: Int64? {
        guard let position = commitPosition, position != committed else { return nil }
        return position
    }
}
