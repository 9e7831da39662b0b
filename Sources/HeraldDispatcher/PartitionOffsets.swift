/// The offsets of one partition that are started but not settled, the offsets skipped over, and what may be
/// committed.
///
/// Jobs of a partition may settle out of order (jobs of different targets run concurrently); the commit
/// position is the oldest unsettled or missing offset, so a commit never passes a job that has not settled or
/// has not been seen. The jobs topic has no compaction and no transactions, so every offset holds a record: a
/// record that arrives past the next expected offset means the ones between were left out of a fetch (Tansu does
/// this now and then) and must be read again.
struct PartitionOffsets: Sendable, Equatable {
    /// Started and unsettled, ascending.
    private(set) var pending: [Int64] = []
    /// Below `next` and never received: ascending, disjoint ranges (a gap costs one entry however long).
    private(set) var missing: [Range<Int64>] = []
    /// One past the highest offset received.
    private(set) var next: Int64?
    /// Where the first record is expected (`expect(from:)`).
    private var expectedStart: Int64?
    /// The last position the broker acknowledged for the group.
    var committed: Int64?

    /// What to do with a record just received.
    enum Admission: Equatable {
        /// Run it.
        case start
        /// Run it; the offsets before it, from `missingFrom`, were skipped and are now missing.
        case startAfterGap(missingFrom: Int64, count: Int64)
        /// Already received (a re-read after a gap delivers it again): do not run it twice.
        case duplicate
    }

    /// Where reading starts (the group's committed offset, still in the log), before anything was received: a
    /// first record past it means a fetch left out the ones before it, as a later jump would.
    mutating func expect(from offset: Int64) {
        if next == nil { expectedStart = offset }
    }

    /// Admits the record at `offset` and, unless it is a duplicate, registers it as started.
    mutating func receive(_ offset: Int64) -> Admission {
        guard let expected = next else {
            next = offset + 1
            pending.append(offset)
            // One before the expected start (the broker reset a position it no longer has) starts the count afresh.
            guard let start = expectedStart, offset > start else { return .start }
            missing.append(start..<offset)
            return .startAfterGap(missingFrom: start, count: offset - start)
        }
        if offset < expected {
            guard let index = missing.firstIndex(where: { $0.contains(offset) }) else { return .duplicate }
            let gap = missing[index]
            missing.replaceSubrange(index...index, with: [gap.lowerBound..<offset, offset + 1..<gap.upperBound]
                .filter { !$0.isEmpty })
            pending.insert(offset, at: pending.firstIndex { $0 > offset } ?? pending.endIndex)
            return .start
        }
        next = offset + 1
        pending.append(offset)
        guard offset > expected else { return .start }
        missing.append(expected..<offset)
        return .startAfterGap(missingFrom: expected, count: offset - expected)
    }

    /// The log now starts at `start`: missing offsets below it were deleted (retention) before they were read
    /// again and can never be; they stop holding commits back. Returns how many there were.
    mutating func logStarts(at start: Int64) -> Int64 {
        var gone: Int64 = 0
        missing = missing.compactMap { range in
            guard range.lowerBound < start else { return range }
            gone += min(range.upperBound, start) - range.lowerBound
            return range.upperBound > start ? start..<range.upperBound : nil
        }
        return gone
    }

    mutating func settle(_ offset: Int64) {
        if let index = pending.firstIndex(of: offset) { pending.remove(at: index) }
    }

    /// The oldest offset to read again, when some are missing.
    var firstMissing: Int64? { missing.first?.lowerBound }

    /// The next offset to read once everything settled so far is committed: the oldest unsettled or missing
    /// offset, or one past the highest received when there is none.
    var commitPosition: Int64? {
        switch (pending.first, firstMissing) {
        case let (started?, skipped?): min(started, skipped)
        case let (started, skipped): started ?? skipped ?? next
        }
    }

    /// A position to commit that the broker does not have yet.
    var uncommitted: Int64? {
        guard let position = commitPosition, position != committed else { return nil }
        return position
    }
}
