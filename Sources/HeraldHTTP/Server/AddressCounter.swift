import Foundation
import HeraldRuntime

/// Open connections per client address across every worker thread, for `maxConnectionsPerAddress`.
/// Counted across loops: each loop accepts whichever connection wakes it, so a per-loop count would make the
/// effective limit vary with the thread count and with luck. An IPv6 client counts by its /64: one host is
/// usually given a whole /64, and could otherwise open each connection from another address of it.
final class AddressCounter: Sendable {
    /// 0 = no limit (nothing is counted).
    let limit: Int
    private let counts = Lock<[String: Int]>([:])

    init(limit: Int) { self.limit = limit }

    /// Counts a new connection from `address`; false (and not counted) when that address is at the limit.
    func admit(_ address: String) -> Bool {
        let key = Self.key(address)
        return counts.withLock { counts in
            let open = counts[key, default: 0]
            guard open < limit else { return false }
            counts[key] = open + 1
            return true
        }
    }

    /// A connection counted by `admit` has closed.
    func release(_ address: String) {
        let key = Self.key(address)
        counts.withLock { counts in
            let open = counts[key, default: 1] - 1
            counts[key] = open > 0 ? open : nil
        }
    }

    /// What a connection from `address` counts under: an IPv4 address itself (also written IPv4-mapped), an IPv6
    /// address's /64.
    static func key(_ address: String) -> String {
        var bytes = in6_addr()
        guard address.contains(":"), inet_pton(AF_INET6, address, &bytes) == 1 else { return address }
        let mapped = withUnsafeBytes(of: bytes) { raw in
            raw.prefix(10).allSatisfy { $0 == 0 } && raw[10] == 0xFF && raw[11] == 0xFF ? raw.suffix(4).map(String.init) : nil
        }
        if let mapped { return mapped.joined(separator: ".") }
        return withUnsafeBytes(of: bytes) { raw in
            stride(from: 0, to: 8, by: 2).map { String(UInt16(raw[$0]) << 8 | UInt16(raw[$0 + 1]), radix: 16) }
                .joined(separator: ":") + "::/64"
        }
    }
}
