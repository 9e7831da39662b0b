internal import CHiredis
import Foundation

/// Owns one blocking hiredis context: opens it (with `AUTH` and `SELECT`), writes encoded commands, reads replies,
/// and frees it on any I/O error so the next use opens a fresh connection.
///
/// Not Sendable: exactly one worker thread creates and uses it. Every call here may block, so it must never run on
/// Swift's cooperative pool.
final class RedisConnection {
    private let configuration: RedisConfiguration
    private var context: UnsafeMutablePointer<redisContext>?

    init(configuration: RedisConfiguration) {
        self.configuration = configuration
    }

    deinit {
        disconnect()
    }

    var isConnected: Bool { context != nil }

    /// True when the idle socket is already readable: with no reply outstanding, that can only be the server's
    /// close (a restart, an idle timeout), so the next batch opens a new connection instead of failing on this one.
    var peerHasClosed: Bool {
        guard let context else { return false }
        var descriptor = pollfd(fd: context.pointee.fd, events: Int16(POLLIN), revents: 0)
        return poll(&descriptor, 1, 0) != 0
    }

    /// Opens a new connection (dropping any previous one) and authenticates and selects the database on it.
    func connect(timeout: Duration) throws(RedisError) {
        disconnect()
        guard let opened = redisConnectWithTimeout(configuration.host, Int32(configuration.port), timeval(timeout)) else {
            throw RedisError(.connection, "connect to \(address): hiredis could not allocate a context")
        }
        if opened.pointee.err != 0 {
            let message = Self.errorText(opened)
            redisFree(opened)
            throw RedisError(.connection, "connect to \(address): \(message)")
        }
        context = opened
        // Keep-alive notices a peer that vanished without closing (a dead host, a dropped NAT entry).
        _ = redisEnableKeepAlive(opened)

        let handshake = configuration.handshake
        guard handshake.commandCount > 0 else { return }
        try append(handshake.bytes)
        try setTimeout(timeout)
        var index = 0
        while index < handshake.commandCount {
            if case .error(let message) = try readReply() {
                disconnect()
                throw configuration.handshakeError(replyAt: index, message)
            }
            index += 1
        }
    }

    /// Frees the context; the next `connect` opens a new one.
    func disconnect() {
        if let context { redisFree(context) }
        context = nil
    }

    /// Buffers already-encoded commands; they are written by the next `readReply`.
    func append(_ bytes: [UInt8]) throws(RedisError) {
        let context = try connected()
        let status = bytes.withUnsafeBufferPointer { buffer in
            buffer.withMemoryRebound(to: CChar.self) { redisAppendFormattedCommand(context, $0.baseAddress, $0.count) }
        }
        if status != REDIS_OK {
            disconnect()
            throw RedisError(.connection, "hiredis could not buffer the command (out of memory)")
        }
    }

    /// Bounds each blocking read and write on the socket; a read that waits longer fails with `.timeout`.
    func setTimeout(_ timeout: Duration) throws(RedisError) {
        let context = try connected()
        if redisSetTimeout(context, timeval(timeout)) != REDIS_OK {
            let message = Self.errorText(context)
            disconnect()
            throw RedisError(.connection, "setting the socket timeout failed: \(message)")
        }
    }

    /// Writes whatever is buffered, then blocks for the next reply. On any failure the connection is dropped.
    func readReply() throws(RedisError) -> RedisValue {
        let context = try connected()
        var raw: UnsafeMutableRawPointer?
        if redisGetReply(context, &raw) != REDIS_OK {
            let savedErrno = errno
            let kind = context.pointee.err
            let message = Self.errorText(context)
            disconnect()
            if kind == REDIS_ERR_IO, savedErrno == EAGAIN || savedErrno == EWOULDBLOCK {
                throw RedisError(.timeout, "no reply from \(address) in time; connection reset")
            }
            if kind == REDIS_ERR_PROTOCOL { throw RedisError(.protocol, "\(address): \(message)") }
            throw RedisError(.connection, "\(address): \(message)")
        }
        guard let raw else {
            disconnect()
            throw RedisError(.protocol, "\(address): hiredis returned no reply")
        }
        defer { freeReplyObject(raw) }
        return Self.value(raw.assumingMemoryBound(to: redisReply.self))
    }

    private var address: String { "\(configuration.host):\(configuration.port)" }

    private func connected() throws(RedisError) -> UnsafeMutablePointer<redisContext> {
        guard let context else { throw RedisError(.connection, "not connected to \(address)") }
        return context
    }

    /// Converts a hiredis reply (from a context or a `redisReader`) into a `RedisValue`.
    static func value(_ reply: UnsafePointer<redisReply>) -> RedisValue {
        let reply = reply.pointee
        switch reply.type {
        case REDIS_REPLY_STRING:
            return .bulk(Array(UnsafeRawBufferPointer(start: reply.str, count: reply.len)))
        case REDIS_REPLY_STATUS:
            return .status(String(decoding: UnsafeRawBufferPointer(start: reply.str, count: reply.len), as: UTF8.self))
        case REDIS_REPLY_ERROR:
            return .error(String(decoding: UnsafeRawBufferPointer(start: reply.str, count: reply.len), as: UTF8.self))
        case REDIS_REPLY_INTEGER:
            return .integer(Int64(reply.integer))
        case REDIS_REPLY_ARRAY:
            var elements: [RedisValue] = []
            elements.reserveCapacity(reply.elements)
            for index in 0..<reply.elements {
                guard let element = reply.element[index] else { elements.append(.null); continue }
                elements.append(value(element))
            }
            return .array(elements)
        default:
            // RESP2 has no other reply types; REDIS_REPLY_NIL and anything unknown read as nil.
            return .null
        }
    }

    private static func errorText(_ context: UnsafeMutablePointer<redisContext>) -> String {
        withUnsafeBytes(of: context.pointee.errstr) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
    }

    /// A `timeval` for hiredis; at least 1 ms, because a zero socket timeout means "wait forever".
    private func timeval(_ duration: Duration) -> Foundation.timeval {
        let micros = max(1_000, duration.inMicroseconds)
        return Foundation.timeval(tv_sec: Int(micros / 1_000_000), tv_usec: Int(micros % 1_000_000))
    }
}

extension RedisConfiguration {
    /// What every new connection sends first: `AUTH` when a password is set, `SELECT` for a database other than 0.
    var handshake: RESPEncoder {
        var handshake = RESPEncoder()
        if let password {
            handshake.append(username.map { ["AUTH", $0, password] } ?? ["AUTH", password])
        }
        if database != 0 { handshake.append(["SELECT", String(database)]) }
        return handshake
    }

    /// The error for an error reply to the handshake's command at `index`.
    func handshakeError(replyAt index: Int, _ message: String) -> RedisError {
        let isAuth = index == 0 && password != nil
        return RedisError(isAuth ? .authentication : .server, "\(isAuth ? "AUTH" : "SELECT"): \(message)")
    }
}
