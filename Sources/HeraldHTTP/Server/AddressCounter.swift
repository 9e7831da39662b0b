import HeraldRuntime

/// Open connections per client address across every worker thread, for `maxConnectionsPerAddress`.
/// Counted across loops: each loop accepts whichever connection wakes it, so a per-loop count would make the
/// effective limit vary with the thread count and with luck.
final class AddressCounter: Sendable {
    /// 0 = no limit (nothing is counted).
    let limit: Int
    private let counts = Lock<[String: Int]>([:])

    init(limit: Int) { self.limit = limit }

    /// Counts a new connection from `address`; false (and not counted) when that address is at the limit.
    func admit(_ address: String) -> Bool {
        counts.withLock { counts in
            let open = counts[address, default: 0]
            guard open < limit else { return false }
            counts[address] = open + 1
            return true
        }
    }

    /// A connection counted by `admit` has closed.
    func release(_ address: String) {
        counts.withLock { counts in
            let open = counts[address, default: 1] - 1
            counts[address] = open > 0 ? open : nil
        }
    }
}
