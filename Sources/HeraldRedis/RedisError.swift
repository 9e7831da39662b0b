import HeraldRuntime

/// Why a Redis call failed.
///
/// `isConnectionFailure` separates "Redis is unreachable or too slow" (answer HTTP 503, retry later) from errors
/// Redis itself returned for a command (a bug or bad data: 500).
public struct RedisError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Code: Sendable, Hashable {
        /// The TCP connection could not be opened or broke (the hiredis message says which).
        case connection
        /// No reply before the call's deadline; the connection was reset.
        case timeout
        /// Redis sent bytes hiredis could not parse; the connection was reset.
        case `protocol`
        /// `AUTH` was refused.
        case authentication
        /// Redis answered with an error reply (`ERR …`, `WRONGTYPE …`).
        case server
        /// `EVALSHA` of a script Redis does not have (`run(_:keys:args:)` handles this itself).
        case noScript
        /// Too many commands already queued: the caller should shed load.
        case overloaded
        /// The client was closed.
        case closed
        /// Redis is up but not serving commands: loading its dataset after a restart (`LOADING`), stuck in a
        /// long script (`BUSY`), a replica that lost its master (`MASTERDOWN`), a cluster missing a node
        /// (`CLUSTERDOWN`) or moving a slot (`TRYAGAIN`). Retry later, like a lost connection.
        case unavailable
    }

    public var code: Code
    /// hiredis' error text for connection errors, or Redis' error reply for server errors, with every run of 32 or
    /// more hex digits cut to its first six (`masked`).
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = Self.masked(message)
    }

    /// `text` with each run of 32 or more hex digits cut to its first six and "…": an error of a script names it by
    /// its SHA-1, and a reply naming a key may hold a push token; errors are logged and written into dead letters,
    /// which carry neither.
    static func masked(_ text: String) -> String {
        let bytes = Array(text.utf8)
        var output: [UInt8] = [], index = 0, masked = false
        output.reserveCapacity(bytes.count)
        while index < bytes.count {
            var end = index
            while end < bytes.count, bytes[end].isHexDigit { end += 1 }
            if end - index >= 32 {
                output += bytes[index..<index + 6] + Array("…".utf8)
                masked = true
            } else {
                output += bytes[index..<end]
            }
            if end < bytes.count { output.append(bytes[end]) }
            index = end + 1
        }
        return masked ? String(decoding: output, as: UTF8.self) : text
    }

    /// Redis could not be reached, did not answer in time, or refused the credentials: a 503, not a bug.
    public var isConnectionFailure: Bool {
        switch code {
        case .connection, .timeout, .protocol, .authentication, .overloaded, .closed, .unavailable: true
        case .server, .noScript: false
        }
    }

    /// The first word of a server error reply (`ERR`, `WRONGTYPE`, `NOSCRIPT`…); `nil` for other codes.
    public var serverErrorPrefix: String? {
        guard code == .server || code == .noScript else { return nil }
        return message.split(separator: " ", maxSplits: 1).first.map(String.init)
    }

    public var description: String { "redis \(code): \(message)" }

    /// Redis refused a write it would take at another time: out of memory (`OOM`), a replica since a failover
    /// (`READONLY`), snapshots failing (`MISCONF`), too few replicas (`NOREPLICAS`). Retry later; an operator has to
    /// look. Redis 6 wraps these in a script's error (`ERR Error running script … -OOM …`).
    public var isRefusingWrites: Bool {
        guard code == .server else { return false }
        let prefix = message.prefix { $0 != " " }
        if Self.writeRefusalPrefixes.contains(prefix) { return true }
        return message.hasPrefix("ERR Error running script")
            && Self.writeRefusalPrefixes.contains { message.contains("-\($0) ") }
    }

    /// An answer about the data itself, the same on every try until someone fixes the key: `WRONGTYPE` (a key of
    /// another type where a record belongs) or a script's Lua error (a record it cannot read). Not a refused write
    /// nor a missing permission, which an operator fixes without touching the data.
    public var isAboutTheData: Bool {
        guard code == .server, !isRefusingWrites else { return false }
        if serverErrorPrefix == "WRONGTYPE" { return true }
        return message.hasPrefix("ERR user_script:") // Redis 7; Redis 6 wraps it, and a command's error in it:
            || message.hasPrefix("ERR Error running script")
                && (message.contains(": user_script:") || message.contains(": WRONGTYPE ") || message.contains(": -WRONGTYPE "))
    }

    private static let writeRefusalPrefixes: Set<Substring> = ["OOM", "READONLY", "MISCONF", "NOREPLICAS"]

    /// The error a `command` call throws for an error reply.
    public static func fromReply(_ message: String) -> RedisError {
        let prefix = message.prefix { $0 != " " }
        if prefix == "NOSCRIPT" { return RedisError(.noScript, message) }
        if unavailablePrefixes.contains(prefix) { return RedisError(.unavailable, message) }
        return RedisError(.server, message)
    }

    /// The error replies of a Redis that serves no command at all (not `BUSYGROUP` and the like: whole words).
    private static let unavailablePrefixes: Set<Substring> = ["LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN"]

    /// `.unavailable` when `reply` says Redis is not serving; nil for any other reply, other errors included.
    static func unavailability(of reply: RedisValue) -> RedisError? {
        guard case .error(let message) = reply else { return nil }
        let error = fromReply(message)
        return error.code == .unavailable ? error : nil
    }
}
