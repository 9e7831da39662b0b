internal import CHiredis
import Foundation
import HeraldRuntime

/// One pool connection, used as if blocking: opens a socket (with TLS, `AUTH` and `SELECT`), buffers encoded
/// commands, writes them and reads replies with hiredis' reply parser, each wait bounded by a deadline; on any
/// I/O error it closes, so the next use opens a fresh connection.
///
/// Not Sendable: exactly one worker thread creates and uses it. Every call here may block, so it must never run on
/// Swift's cooperative pool.
final class RedisConnection {
    private let configuration: RedisConfiguration
    private var stream: RedisStream?
    private var reader: UnsafeMutablePointer<redisReader>?
    private var output: [UInt8] = []
    /// When the current wait (connect, or the batch's replies) gives up.
    private var deadline = ContinuousClock.now
    /// A host name lookup under way (`resolve`).
    private var lookup: NameLookup?
    private let input = UnsafeMutableRawBufferPointer.allocate(byteCount: 65_536, alignment: 1)

    init(configuration: RedisConfiguration) {
        self.configuration = configuration
    }

    deinit {
        disconnect()
        input.deallocate()
    }

    var isConnected: Bool { stream != nil }

    /// True when the idle connection has been closed by the server (a restart, an idle timeout), so the next batch
    /// opens a new connection instead of failing on this one. With no reply outstanding, readable can only mean that,
    /// or a TLS session ticket, which a read consumes.
    var peerHasClosed: Bool {
        guard let stream else { return false }
        var descriptor = pollfd(fd: stream.descriptor, events: Int16(POLLIN), revents: 0)
        guard poll(&descriptor, 1, 0) != 0 else { return false }
        guard stream.isSecured, case .wouldBlock = stream.read(into: input) else { return true }
        return false
    }

    /// The host's addresses, within the deadline. A name is looked up on a thread of its own, as the loop
    /// connections do: `getaddrinfo` cannot be cancelled, and a resolver that does not answer would otherwise hold
    /// this worker (and every call queued for it) through glibc's retries, tens of seconds.
    private func resolve() throws(RedisError) -> [SocketAddress] {
        let (host, port) = (configuration.host, configuration.port)
        if let numeric = SocketAddress.resolve(host, port: port, numericOnly: true) { return numeric }
        // A lookup the last connect gave up on is waited for again: one thread per connection, not per attempt.
        let lookup = self.lookup ?? NameLookup(host: host, port: port)
        self.lookup = lookup
        let left = max(0, (deadline - .now).inMilliseconds)
        guard lookup.answered.wait(timeout: .now() + .milliseconds(Int(left))) == .success else {
            throw RedisError(.connection, "connect to \(address): no answer from the name resolver in time")
        }
        self.lookup = nil
        return lookup.addresses.withLock { $0 }
    }

    /// Opens a new connection (dropping any previous one), secures it, and authenticates and selects the database.
    func connect(timeout: Duration) throws(RedisError) {
        disconnect()
        deadline = .now + timeout
        let addresses = try resolve()
        guard !addresses.isEmpty else { throw RedisError(.connection, "connect to \(address): unknown host") }
        var lastProblem = "no address"
        for candidate in addresses {
            do {
                try open(candidate)
                break
            } catch {
                lastProblem = error.message
            }
        }
        guard let stream else { throw RedisError(.connection, "connect to \(address): \(lastProblem)") }
        while true {
            switch stream.handshake() {
            case .moved: break
            case .wouldBlock(let wantsWrite):
                try wait(wantsWrite ? POLLOUT : POLLIN, else: .connection, "TLS handshake with \(address): timed out")
                continue
            case .closedByPeer:
                try failed(.connection, "TLS handshake with \(address): closed by the server")
            case .failed(let message):
                try failed(.connection, "TLS handshake with \(address): \(message)")
            }
            break
        }

        let handshake = configuration.handshake
        guard handshake.commandCount > 0 else { return }
        append(handshake.bytes)
        var index = 0
        while index < handshake.commandCount {
            if case .error(let message) = try readReply() {
                disconnect()
                throw configuration.handshakeError(replyAt: index, message)
            }
            index += 1
        }
    }

    /// A non-blocking connect to one address, waited for until the deadline.
    private func open(_ candidate: SocketAddress) throws(RedisError) {
        let descriptor = socket(candidate.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue)
                                    | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { throw RedisError(.connection, String(cString: strerror(errno))) }
        SocketAddress.tune(descriptor)
        let started = candidate.bytes.withUnsafeBytes { raw in
            Glibc.connect(descriptor, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(raw.count))
        }
        guard started == 0 || errno == EINPROGRESS else {
            let problem = String(cString: strerror(errno))
            Glibc.close(descriptor)
            throw RedisError(.connection, problem)
        }
        do throws(RedisError) {
            stream = try RedisStream(descriptor: descriptor, tls: configuration.tls, host: configuration.host)
        } catch {
            Glibc.close(descriptor)
            throw error
        }
        try wait(POLLOUT, else: .connection, "timed out")
        var problem: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        if getsockopt(descriptor, SOL_SOCKET, SO_ERROR, &problem, &length) != 0 { problem = errno }
        if problem != 0 { try failed(.connection, String(cString: strerror(problem))) }
        reader = redisReaderCreate()
        if reader == nil { try failed(.connection, "hiredis could not allocate a reader") }
    }

    /// Closes the connection; the next `connect` opens a new one.
    func disconnect() {
        stream?.close()
        stream = nil
        if let reader { redisReaderFree(reader) }
        reader = nil
        output.removeAll()
    }

    /// Buffers already-encoded commands; they are written by the next `readReply`.
    func append(_ bytes: [UInt8]) {
        output.append(contentsOf: bytes)
    }

    /// Bounds the wait for the replies to what has been appended; past it `readReply` fails with `.timeout`.
    func setTimeout(_ timeout: Duration) {
        deadline = .now + max(.milliseconds(1), timeout)
    }

    /// Writes whatever is buffered, then waits for the next reply. On any failure the connection is dropped.
    func readReply() throws(RedisError) -> RedisValue {
        try flush()
        while true {
            guard let reader else { throw RedisError(.connection, "not connected to \(address)") }
            var raw: UnsafeMutableRawPointer?
            guard redisReaderGetReply(reader, &raw) == REDIS_OK else {
                let message = withUnsafeBytes(of: reader.pointee.errstr) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
                try failed(.protocol, "\(address): \(message)")
            }
            if let raw {
                defer { freeReplyObject(raw) }
                return Self.value(raw.assumingMemoryBound(to: redisReply.self))
            }
            try fill(reader)
        }
    }

    private func flush() throws(RedisError) {
        guard !output.isEmpty else { return }
        guard let stream else { throw RedisError(.connection, "not connected to \(address)") }
        var written = 0
        while written < output.count {
            let result = output.withUnsafeBytes { stream.write(UnsafeRawBufferPointer(rebasing: $0[written...])) }
            switch result {
            case .moved(let count): written += count
            case .wouldBlock(let wantsWrite):
                try wait(wantsWrite ? POLLOUT : POLLIN, else: .timeout, "no reply from \(address) in time; connection reset")
            case .closedByPeer: try failed(.connection, "\(address): connection closed by the server")
            case .failed(let message): try failed(.connection, "\(address): \(message)")
            }
        }
        // A multi-megabyte pipeline should not pin its buffer for the life of the connection.
        if output.capacity > 1 << 20 { output = [] } else { output.removeAll(keepingCapacity: true) }
    }

    /// Reads what has arrived into the reply parser, waiting for it until the deadline.
    private func fill(_ reader: UnsafeMutablePointer<redisReader>) throws(RedisError) {
        guard let stream else { throw RedisError(.connection, "not connected to \(address)") }
        while true {
            switch stream.read(into: input) {
            case .moved(let count):
                if redisReaderFeed(reader, input.baseAddress?.assumingMemoryBound(to: CChar.self), count) != REDIS_OK {
                    try failed(.protocol, "\(address): hiredis could not buffer the reply")
                }
                return
            case .wouldBlock(let wantsWrite):
                try wait(wantsWrite ? POLLOUT : POLLIN, else: .timeout, "no reply from \(address) in time; connection reset")
            case .closedByPeer: try failed(.connection, "\(address): connection closed by the server")
            case .failed(let message): try failed(.connection, "\(address): \(message)")
            }
        }
    }

    /// Waits until the socket is ready for `events` or the deadline passes (then fails with `code`).
    private func wait(_ events: Int32, else code: RedisError.Code, _ message: @autoclosure () -> String) throws(RedisError) {
        guard let stream else { throw RedisError(.connection, "not connected to \(address)") }
        while true {
            let left = deadline - .now
            guard left > .zero else { try failed(code, message()) }
            var descriptor = pollfd(fd: stream.descriptor, events: Int16(events), revents: 0)
            let ready = poll(&descriptor, 1, Int32(clamping: max(1, left.inMilliseconds)))
            if ready > 0 { return }
            if ready < 0, errno != EINTR { try failed(.connection, "\(address): \(String(cString: strerror(errno)))") }
        }
    }

    /// Drops the connection and throws.
    private func failed(_ code: RedisError.Code, _ message: String) throws(RedisError) -> Never {
        disconnect()
        throw RedisError(code, message)
    }

    private var address: String { "\(configuration.host):\(configuration.port)" }

    /// Converts a reply from a hiredis `redisReader` into a `RedisValue`.
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

/// `getaddrinfo` of a host name on a thread of its own: it cannot be cancelled, so a caller waits for `answered`
/// as long as it may, and may wait again later.
private final class NameLookup: Sendable {
    let answered = DispatchSemaphore(value: 0)
    let addresses = Lock<[SocketAddress]>([])

    init(host: String, port: Int) {
        Thread.named("redis-resolve") { [addresses, answered] in
            let found = SocketAddress.resolve(host, port: port, numericOnly: false) ?? []
            addresses.withLock { $0 = found }
            answered.signal()
        }.start()
    }
}
