/// What the client needs of Redis Cluster's rules: which slot a key hashes to, which argument of a command is its
/// key, the redirections a node answers with, and the slot map `CLUSTER SLOTS` describes.
public enum RedisCluster {
    /// Slots in a cluster.
    public static let slotCount = 16_384

    /// The slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag (the text between the first `{` and the
    /// next `}`, when not empty), modulo 16,384.
    public static func slot(of key: some StringProtocol) -> Int {
        slot(ofKeyBytes: Array(key.utf8))
    }

    /// `slot(of:)` for a key of arbitrary bytes.
    static func slot(ofKeyBytes key: [UInt8]) -> Int {
        slot(ofBytes: hashTag(key) ?? key[...])
    }

    /// The text between the first `{` and the next `}`, when not empty.
    private static func hashTag(_ key: [UInt8]) -> ArraySlice<UInt8>? {
        guard let open = key.firstIndex(of: UInt8(ascii: "{")),
              let close = key[(open + 1)...].firstIndex(of: UInt8(ascii: "}")), close > open + 1 else { return nil }
        return key[(open + 1)..<close]
    }

    private static func slot<C: Collection<UInt8>>(ofBytes bytes: C) -> Int {
        var crc: UInt16 = 0
        for byte in bytes {
            crc = (crc << 8) ^ crcTable[Int(UInt8(truncatingIfNeeded: crc >> 8) ^ byte)]
        }
        return Int(crc) & (slotCount - 1)
    }

    private static let crcTable: [UInt16] = (0..<256).map { index in
        var crc = UInt16(index) << 8
        for _ in 0..<8 { crc = crc & 0x8000 != 0 ? (crc << 1) ^ 0x1021 : crc << 1 }
        return crc
    }

    /// The position of the key a command is routed by: the first key, or nil for a command without one (`PING`,
    /// `INFO`, `SCRIPT LOAD`…), which any node answers. `EVAL`/`EVALSHA` are routed by their first declared key.
    static func keyPosition(upperName upper: String, argumentCount: Int, declaredKeys: () -> Int?) -> Int? {
        if scriptCommands.contains(upper) { return argumentCount > 3 && (declaredKeys() ?? 0) > 0 ? 3 : nil }
        if keylessCommands.contains(upper) { return nil }
        if upper == "OBJECT" || upper == "MEMORY" { return argumentCount > 2 ? 2 : nil }
        return argumentCount > 1 ? 1 : nil
    }

    /// The slot `arguments` is routed by; nil when any node may answer. `KEYS` with a hash tag in its pattern
    /// matches keys of one slot only, and goes to that slot's node.
    static func slot(of arguments: [String]) -> Int? {
        guard let name = arguments.first?.uppercased() else { return nil }
        if name == "KEYS", arguments.count == 2, let tag = hashTag(Array(arguments[1].utf8)) {
            return slot(ofBytes: tag)
        }
        guard let position = keyPosition(upperName: name, argumentCount: arguments.count,
                                         declaredKeys: { Int(arguments[2]) }) else { return nil }
        return slot(of: arguments[position])
    }

    /// `slot(of:)` for a command of arbitrary bytes.
    static func slot(ofBytes arguments: [[UInt8]]) -> Int? {
        guard let name = arguments.first,
              let position = keyPosition(upperName: String(decoding: name, as: UTF8.self).uppercased(),
                                         argumentCount: arguments.count,
                                         declaredKeys: { Int(String(decoding: arguments[2], as: UTF8.self)) })
        else { return nil }
        return slot(ofKeyBytes: arguments[position])
    }

    private static let scriptCommands: Set<String> = ["EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO"]
    private static let keylessCommands: Set<String> = [
        "PING", "ECHO", "INFO", "SCRIPT", "CLUSTER", "AUTH", "HELLO", "SELECT", "ASKING", "READONLY", "READWRITE",
        "MULTI", "EXEC", "DISCARD", "DBSIZE", "FLUSHALL", "FLUSHDB", "SCAN", "RANDOMKEY", "CONFIG", "CLIENT",
        "TIME", "ACL", "COMMAND", "WAIT", "DEBUG", "ROLE", "SLOWLOG", "LATENCY", "SAVE", "BGSAVE", "LASTSAVE",
        "PUBLISH", "FUNCTION", "SHUTDOWN",
    ]

    /// A node's answer that the key's slot is served elsewhere.
    enum Redirect: Equatable {
        /// The slot has moved for good: refresh the map and send there.
        case moved(slot: Int, to: RedisAddress)
        /// The slot is migrating: send this one command there, after `ASKING`.
        case ask(slot: Int, to: RedisAddress)
        /// The slot is migrating and the command's keys are not all on the node asked (`TRYAGAIN`): send it again
        /// where it went, a little later.
        case tryAgain

        /// From an error reply, `MOVED 3999 127.0.0.1:6381`, `ASK 3999 127.0.0.1:6381` or `TRYAGAIN …`; nil for other
        /// replies.
        /// A node that does not know its own address (`cluster-preferred-endpoint-type unknown-endpoint`, or no
        /// hostname) names none: `MOVED 3999 :6381`, `?:6381`; the host is then `asked`'s, as in `CLUSTER SLOTS`.
        init?(_ reply: RedisValue, asked: RedisAddress? = nil) {
            guard case .error(let message) = reply else { return nil }
            if message == "TRYAGAIN" || message.hasPrefix("TRYAGAIN ") {
                self = .tryAgain
                return
            }
            guard message.hasPrefix("MOVED ") || message.hasPrefix("ASK ") else { return nil }
            let words = message.split(separator: " ")
            guard words.count == 3, let slot = Int(words[1]), let colon = words[2].lastIndex(of: ":"),
                  let port = Int(words[2][words[2].index(after: colon)...]) else { return nil }
            var host = words[2][..<colon]
            if host.hasPrefix("["), host.hasSuffix("]") { host = host.dropFirst().dropLast() }
            let address = RedisAddress(host: host.isEmpty || host == "?" ? asked?.host ?? "" : String(host), port: port)
            self = words[0] == "MOVED" ? .moved(slot: slot, to: address) : .ask(slot: slot, to: address)
        }
    }

    /// The masters serving each slot range, from a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id…],
    /// replicas…]…]`. A master with an empty host (the node does not know its own address) is at `asked`'s host.
    /// Nil when the reply is not in that form.
    static func slotRanges(_ reply: RedisValue, asked: RedisAddress) -> [(ClosedRange<Int>, RedisAddress)]? {
        guard let entries = reply.array else { return nil }
        var ranges: [(ClosedRange<Int>, RedisAddress)] = []
        for entry in entries {
            guard let parts = entry.array, parts.count >= 3, let start = parts[0].int, let end = parts[1].int,
                  start <= end, start >= 0, end < slotCount,
                  let master = parts[2].array, master.count >= 2, let port = master[1].int,
                  // NULL or "": the node's endpoint is unknown (cluster-preferred-endpoint-type unknown-endpoint),
                  // reached at the asked node's host.
                  let host = master[0] == .null ? "" : master[0].string
            else { return nil }
            // "?": a node announcing a hostname it has none of; not necessarily at the asked host. Its slots stay
            // without a node (503) until the map names one.
            if host == "?" { continue }
            let address = RedisAddress(host: host.isEmpty ? asked.host : host, port: Int(port))
            ranges.append((Int(start)...Int(end), address))
        }
        return ranges
    }
}
