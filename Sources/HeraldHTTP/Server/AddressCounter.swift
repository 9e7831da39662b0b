import Foundation
import HeraldRuntime

/// Open connections per client address across every worker thread, for `maxConnectionsPerAddress`.
/// Counted across loops: each loop accepts whichever connection wakes it, so a per-loop count would make the
/// effective limit vary with the thread count and with luck.
final class AddressCounter: Sendable {
    /// 0 = no limit (nothing is counted).
    let limit: Int
    /// IPv6 clients count per network of this many leading bits: one subscriber line gets a whole /64, so one
    /// client can open connections from as many addresses as it likes.
    let ipv6PrefixLength: Int
    private let counts = Lock<[String: Int]>([:])

    init(limit: Int, ipv6PrefixLength: Int = 64) { (self.limit, self.ipv6PrefixLength) = (limit, ipv6PrefixLength) }

    /// Counts a new connection from `address`; false (and not counted) when its network is at the limit.
    func admit(_ address: String) -> Bool {
        let client = Self.client(address, ipv6PrefixLength: ipv6PrefixLength)
        return counts.withLock { counts in
            let open = counts[client, default: 0]
            guard open < limit else { return false }
            counts[client] = open + 1
            return true
        }
    }

    /// A connection counted by `admit` has closed.
    func release(_ address: String) {
        let client = Self.client(address, ipv6PrefixLength: ipv6PrefixLength)
        counts.withLock { counts in
            let open = counts[client, default: 1] - 1
            counts[client] = open > 0 ? open : nil
        }
    }

    /// What one client is, for counting: an IPv4 address (also when written IPv4-mapped, as a dual-stack listener
    /// reports it), or an IPv6 address's first `ipv6PrefixLength` bits written as a network (`2001:db8::/64`).
    static func client(_ address: String, ipv6PrefixLength bits: Int) -> String {
        var raw = in6_addr()
        guard address.contains(":"), inet_pton(AF_INET6, address, &raw) == 1 else { return address }
        let mappedIPv4 = withUnsafeMutableBytes(of: &raw) { bytes -> String? in
            if bytes.prefix(10).allSatisfy({ $0 == 0 }), bytes[10] == 0xff, bytes[11] == 0xff {
                return "\(bytes[12]).\(bytes[13]).\(bytes[14]).\(bytes[15])"
            }
            for index in 0..<16 {
                let kept = min(8, max(0, bits - index * 8))
                bytes[index] &= UInt8(truncatingIfNeeded: 0xff << (8 - kept))
            }
            return nil
        }
        if let mappedIPv4 { return mappedIPv4 }
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        guard inet_ntop(AF_INET6, &raw, &text, socklen_t(text.count)) != nil else { return address }
        return String(cString: text) + "/\(bits)"
    }
}
