import Foundation
import HeraldRuntime

/// What the simulator does with a token, chosen by the token's first four hex digits (see `rules`).
enum TokenClass: UInt8, CaseIterable, Sendable {
    /// Accepted (200).
    case normal
    /// 400 TopicDisallowed on every attempt: not retryable and not a token removal, so a dead letter at once.
    case rejected
    /// 503 on its first two attempts, then 200: retried, delivered.
    case transient
    /// 503 on every attempt: dead-lettered once the retries are exhausted.
    case exhausted
    /// 410 Unregistered: the dispatcher removes the token (no dead letter; seen in the rejected-requests record).
    case unregistered

    var prefix: String {
        switch self {
        case .normal: "c0de"
        case .rejected: "dead"
        case .transient: "5030"
        case .exhausted: "5035"
        case .unregistered: "4100"
        }
    }

    /// The simulator's rules file for these classes.
    static var rules: String {
        """
        {"rules": [
          {"tokenPrefix": "\(TokenClass.rejected.prefix)", "status": 400, "reason": "TopicDisallowed"},
          {"tokenPrefix": "\(TokenClass.transient.prefix)", "status": 503, "reason": "ServiceUnavailable", "times": 2},
          {"tokenPrefix": "\(TokenClass.exhausted.prefix)", "status": 503, "reason": "ServiceUnavailable"},
          {"tokenPrefix": "\(TokenClass.unregistered.prefix)", "status": 410, "reason": "Unregistered"}
        ]}
        """
    }
}

/// Every token the soak made: a token is `<class prefix, 4 hex><index, 12 hex><random, 48 hex>`, so a record
/// line's token gives back its index without a lookup table.
final class TokenBook: Sendable {
    private let classes = Lock<[UInt8]>([])

    /// A fresh token of `kind` and its index.
    func make(_ kind: TokenClass) -> (token: String, index: UInt32) {
        let index = classes.withLock { list -> UInt32 in
            list.append(kind.rawValue)
            return UInt32(list.count - 1)
        }
        var token = kind.prefix + hex(UInt64(index), digits: 12)
        for _ in 0..<3 { token += hex(UInt64.random(in: 0...UInt64(UInt16.max)), digits: 4) }
        for _ in 0..<3 { token += hex(UInt64.random(in: 0...UInt64(UInt32.max)), digits: 8) }
        for _ in 0..<3 { token += hex(UInt64.random(in: 0...UInt64(UInt16.max)), digits: 4) }
        return (token, index)
    }

    func kind(of index: UInt32) -> TokenClass {
        classes.withLock { TokenClass(rawValue: $0[Int(index)])! }
    }

    /// The index carried by a token this book made, or nil for any other string.
    static func index(of token: ArraySlice<UInt8>) -> UInt32? {
        guard token.count == 64 else { return nil }
        var value: UInt64 = 0
        for byte in token.dropFirst(4).prefix(12) {
            guard let digit = hexValue(byte) else { return nil }
            value = value << 4 | UInt64(digit)
        }
        return value <= UInt64(UInt32.max) ? UInt32(value) : nil
    }
}

func hex(_ value: UInt64, digits: Int) -> String {
    let text = String(value, radix: 16)
    return String(repeating: "0", count: max(0, digits - text.count)) + text
}

func hexValue(_ byte: UInt8) -> UInt8? {
    switch byte {
    case 0x30...0x39: byte - 0x30
    case 0x61...0x66: byte - 0x61 + 10
    default: nil
    }
}
