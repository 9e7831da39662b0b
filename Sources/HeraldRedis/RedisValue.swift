/// One Redis reply (RESP2).
///
/// `command(_:)` throws for an error reply, so `.error` is only seen inside `pipeline(_:)` results and inside
/// arrays (e.g. the replies of `EXEC`).
public enum RedisValue: Sendable, Hashable {
    /// A bulk string: arbitrary bytes (`GET`, `HGET`…).
    case bulk([UInt8])
    /// A simple status string such as `OK` or `QUEUED`.
    case status(String)
    case integer(Int64)
    case array([RedisValue])
    /// A nil bulk string or nil array (`GET` of a missing key, a timed-out `BLPOP`).
    case null
    /// An error reply, e.g. `WRONGTYPE Operation against a key holding the wrong kind of value`.
    case error(String)

    /// The text of a bulk or status reply (bytes decoded as UTF-8, invalid sequences repaired); `nil` otherwise.
    public var string: String? {
        switch self {
        case .bulk(let bytes): String(decoding: bytes, as: UTF8.self)
        case .status(let text): text
        default: nil
        }
    }

    /// The bytes of a bulk or status reply; `nil` otherwise.
    public var bytes: [UInt8]? {
        switch self {
        case .bulk(let bytes): bytes
        case .status(let text): Array(text.utf8)
        default: nil
        }
    }

    /// An integer reply, or a bulk string holding a decimal integer (`GET` of a counter); `nil` otherwise.
    public var int: Int64? {
        switch self {
        case .integer(let value): value
        case .bulk(let bytes): Int64(String(decoding: bytes, as: UTF8.self))
        default: nil
        }
    }

    /// The elements of an array reply; `nil` otherwise.
    public var array: [RedisValue]? {
        if case .array(let elements) = self { return elements }
        return nil
    }

    /// The elements of an array reply as text (`nil` elements and non-text elements are dropped).
    public var strings: [String]? {
        array?.compactMap(\.string)
    }

    /// A flat array of field/value pairs (`HGETALL`, `CONFIG GET`) as a dictionary; `nil` for other replies.
    public var fieldValues: [String: String]? {
        guard let elements = array, elements.count % 2 == 0 else { return nil }
        var result: [String: String] = [:]
        result.reserveCapacity(elements.count / 2)
        var index = 0
        while index < elements.count {
            if let field = elements[index].string, let value = elements[index + 1].string { result[field] = value }
            index += 2
        }
        return result
    }

    public var isNull: Bool { self == .null }

    /// The message of an error reply; `nil` otherwise.
    public var errorMessage: String? {
        if case .error(let message) = self { return message }
        return nil
    }
}
