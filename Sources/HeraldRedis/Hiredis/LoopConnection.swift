// Over 400 lines: a Redis connection driven by an event loop (connect, secure, write, read replies, reconnect) is one state machine.
internal import CHiredis
import Foundation
import HeraldRuntime

/// A client's connections on event loops, so that closing the client closes them too.
final class LoopConnections: Sendable {
    private struct State {
        var isClosed = false
        var open: [ObjectIdentifier: LoopConnection] = [:]
    }

    private let state = Lock(State())

    /// Records a new connection; false once the client is closed.
    func register(_ connection: LoopConnection) -> Bool {
        state.withLock { state in
            guard !state.isClosed else { return false }
            state.open[ObjectIdentifier(connection)] = connection
            return true
        }
    }

    var count: Int { state.withLock { $0.open.count } }

    func unregister(_ connection: LoopConnection) {
        state.withLock { _ = $0.open.removeValue(forKey: ObjectIdentifier(connection)) }
    }

    /// Refuses new connections and asks each loop to close its own (waiting calls fail with `.closed`).
    func closeAll() {
        let open = state.withLock { state in
            state.isClosed = true
            defer { state.open = [:] }
            return Array(state.open.values)
        }
        for connection in open { connection.loop.execute { connection.close() } }
    }
}

/// One non-blocking Redis connection driven by the event loop of the thread that uses it: calls made by tasks
/// running on that loop append their encoded commands to an output buffer (behind `AUTH`/`SELECT`'s answers on a
/// new connection), the loop writes everything buffered
/// during a turn in one `send` at the end of the turn, and replies are parsed with a hiredis reader as the socket turns
/// readable, then handed to the waiting calls in order. Nothing leaves the loop's thread.
///
/// Same contract as the pool: every call has its deadline (checked at the end of each turn, so within the loop's
/// 100 ms wake-up); past it every waiting call fails with `.timeout` and the connection is closed. A broken connection fails
/// its calls with `.connection`; the next call reconnects (with `AUTH`/`SELECT` sent ahead of its commands).
// @unchecked: all mutable state is touched only on `loop`'s thread (calls, readiness, hooks, and `close` and the
// name resolution result, which arrive through `loop.execute`); other threads only read the `let`s.
final class LoopConnection: LoopClient, @unchecked Sendable {
    private struct Waiting {
        var replyCount: Int
        var deadline: ContinuousClock.Instant
        var completion: RedisRequest.Completion
        /// Replies so far of a pipeline (a single command is answered straight from the reader).
        var replies: [RedisValue] = []
    }

    private enum Phase {
        /// No socket: the next call connects.
        case idle
        /// Resolving a host name on a helper thread.
        case resolving
        /// A non-blocking connect in progress; the addresses left to try if it fails.
        case connecting([SocketAddress])
        /// The TLS handshake of a `rediss://` connection.
        case securing
        case open
    }

    let loop: any ThreadEventLoop
    private let configuration: RedisConfiguration
    private let registry: LoopConnections
    private let logger: Logger
    private let handshake: RESPEncoder

    private var phase = Phase.idle
    /// The socket while connecting; `stream` owns it from then on.
    private var fd: Int32 = -1
    private var stream: RedisStream?
    private var reader: UnsafeMutablePointer<redisReader>?
    private var generation = 0
    /// This connection's resolver thread has not answered yet (getaddrinfo can block for many seconds when DNS is
    /// down): a reconnect meanwhile waits for its answer rather than starting another thread.
    private var resolverRunning = false
    private var connectDeadline = ContinuousClock.now
    /// `AUTH`/`SELECT` replies still to be consumed ahead of the calls' replies.
    private var handshakeLeft = 0
    /// The calls' commands while `AUTH`/`SELECT` are unanswered: written only once both succeeded, so a refused one
    /// never has them run as the default user or on another database.
    private var held: [UInt8] = []
    private var output: [UInt8] = []
    private var written = 0
    private var watchingWritable = false
    private var waiting: [Waiting] = []
    private var head = 0
    private var queuedCommands = 0
    private var isClosed = false
    private var isHealthy = true
    private let input = UnsafeMutableRawBufferPointer.allocate(byteCount: 65_536, alignment: 1)

    init(loop: any ThreadEventLoop, configuration: RedisConfiguration, registry: LoopConnections, logger: Logger) {
        self.loop = loop
        self.configuration = configuration
        self.registry = registry
        self.logger = logger
        handshake = configuration.handshake
    }

    deinit {
        // Normally closed already by `fail`; closing also takes a descriptor out of every epoll set.
        if let stream { stream.close() } else if fd >= 0 { Glibc.close(fd) }
        if let reader { redisReaderFree(reader) }
        input.deallocate()
    }

    /// Queues a call (from a task on the loop's thread); its completion runs on this thread, later.
    func submit(_ payload: [UInt8], replyCount: Int, deadline: ContinuousClock.Instant,
                completion: RedisRequest.Completion) {
        if isClosed { return completion.fail(RedisError(.closed, "the Redis client is closed")) }
        if queuedCommands > 0, queuedCommands + replyCount > configuration.maxQueuedCommands {
            return completion.fail(RedisError(.overloaded,
                                              "more than \(configuration.maxQueuedCommands) Redis commands queued"))
        }
        let mustConnect = if case .idle = phase { true } else { false }
        if mustConnect {
            output.append(contentsOf: handshake.bytes)
            handshakeLeft = handshake.commandCount
        }
        if handshakeLeft > 0 { held.append(contentsOf: payload) } else { output.append(contentsOf: payload) }
        waiting.append(Waiting(replyCount: replyCount, deadline: deadline, completion: completion))
        queuedCommands += replyCount
        if mustConnect { connect() }
    }

    /// Closes for good (the client was closed): waiting calls fail with `.closed`.
    func close() {
        guard !isClosed else { return }
        isClosed = true
        fail(RedisError(.closed, "the Redis client is closed"), log: false)
        loop.detach(self)
        loop.setValue(nil, forKey: ObjectIdentifier(registry))
        registry.unregister(self)
    }

    // MARK: LoopClient

    func descriptorReady(_ descriptor: Int32, events: DescriptorEvents) {
        guard descriptor == fd else { return }
        if case .connecting(let rest) = phase {
            finishConnect(remaining: rest)
            return
        }
        if case .securing = phase { return secure() }
        if events.contains(.readable) || events.contains(.failed) { readReplies() }
        if fd >= 0, events.contains(.writable) { flush() }
    }

    func endOfTurn(now: ContinuousClock.Instant) {
        guard head < waiting.count else { return }
        switch phase {
        case .resolving, .connecting, .securing:
            // As on the pool, a connect cut short by either deadline is a connection failure.
            if now >= min(connectDeadline, waiting[head].deadline) {
                fail(RedisError(.connection, "connect to \(address): timed out"))
            }
        case .open:
            if now >= waiting[head].deadline {
                return fail(RedisError(.timeout, "no reply from \(address) within \(configuration.commandTimeout); connection reset"))
            }
            if handshakeLeft > 0, now >= connectDeadline {
                return fail(RedisError(.connection, "AUTH/SELECT on \(address): no reply within \(configuration.connectTimeout)"))
            }
            if !watchingWritable, written < output.count { flush() }
        case .idle:
            break
        }
    }

    func loopStopped() {
        isClosed = true
        fail(RedisError(.closed, "the event loop running this Redis connection stopped"), log: false)
        registry.unregister(self)
    }

    // MARK: Connecting

    private var address: String { "\(configuration.host):\(configuration.port)" }

    private func connect() {
        generation += 1
        connectDeadline = .now + configuration.connectTimeout
        if let numeric = SocketAddress.resolve(configuration.host, port: configuration.port, numericOnly: true) {
            phase = .connecting([])
            return tryAddresses(numeric)
        }
        // A host name: getaddrinfo blocks, so it runs on a thread of its own and answers through the loop.
        phase = .resolving
        guard !resolverRunning else { return }
        resolverRunning = true
        let (host, port) = (configuration.host, configuration.port)
        Thread.named("redis-resolve") { [self] in
            let addresses = SocketAddress.resolve(host, port: port, numericOnly: false) ?? []
            loop.execute { [self] in resolved(addresses) }
        }.start()
    }

    /// The resolver's answer, used by whichever attempt is resolving now (it may have started after the thread).
    private func resolved(_ addresses: [SocketAddress]) {
        resolverRunning = false
        guard case .resolving = phase else { return }
        guard !addresses.isEmpty else { return fail(RedisError(.connection, "connect to \(address): unknown host")) }
        tryAddresses(addresses)
    }

    /// Starts a non-blocking connect to the first address that accepts one; the rest are kept for a refusal.
    private func tryAddresses(_ addresses: [SocketAddress]) {
        var lastError: Int32 = EHOSTUNREACH
        for (index, candidate) in addresses.enumerated() {
            let descriptor = Glibc.socket(candidate.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue)
                                              | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard descriptor >= 0 else { lastError = errno; continue }
            SocketAddress.tune(descriptor)
            let started = candidate.bytes.withUnsafeBytes { raw in
                Glibc.connect(descriptor, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self),
                                   socklen_t(raw.count))
            }
            if started == 0 || errno == EINPROGRESS {
                fd = descriptor
                phase = .connecting(Array(addresses[(index + 1)...]))
                guard loop.watch(descriptor, for: .writable, client: self) else {
                    return fail(RedisError(.connection, "cannot watch the Redis socket: \(String(cString: strerror(errno)))"))
                }
                return
            }
            lastError = errno
            Glibc.close(descriptor)
        }
        fail(RedisError(.connection, "connect to \(address): \(String(cString: strerror(lastError)))"))
    }

    /// The socket turned writable while connecting: connected, or refused (then the next address is tried).
    private func finishConnect(remaining: [SocketAddress]) {
        var problem: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        if getsockopt(fd, SOL_SOCKET, SO_ERROR, &problem, &length) != 0 { problem = errno }
        guard problem == 0 else {
            closeSocket()
            guard !remaining.isEmpty else {
                return fail(RedisError(.connection, "connect to \(address): \(String(cString: strerror(problem)))"))
            }
            return tryAddresses(remaining)
        }
        reader = redisReaderCreate()
        guard reader != nil else { return fail(RedisError(.connection, "hiredis could not allocate a reader")) }
        do { stream = try RedisStream(descriptor: fd, tls: configuration.tls, host: configuration.host) } catch {
            return fail(error)
        }
        phase = .securing
        secure()
    }

    /// Drives the TLS handshake (done at once in clear), then starts writing what is buffered.
    private func secure() {
        guard let stream else { return }
        switch stream.handshake() {
        case .moved:
            phase = .open
            watchingWritable = false
            guard loop.watch(fd, for: .readable, client: self) else {
                return fail(RedisError(.connection, "cannot watch the Redis socket: \(String(cString: strerror(errno)))"))
            }
            flush()
        case .wouldBlock(let wantsWrite):
            if !loop.watch(fd, for: wantsWrite ? .writable : .readable, client: self) {
                fail(RedisError(.connection, "cannot watch the Redis socket: \(String(cString: strerror(errno)))"))
            }
        case .closedByPeer:
            fail(RedisError(.connection, "TLS handshake with \(address): closed by the server"))
        case .failed(let message):
            fail(RedisError(.connection, "TLS handshake with \(address): \(message)"))
        }
    }

    // MARK: Writing and reading

    /// Writes what is buffered; what the socket does not take now waits for it to turn writable.
    private func flush() {
        guard let stream else { return }
        while written < output.count {
            switch output.withUnsafeBytes({ stream.write(UnsafeRawBufferPointer(rebasing: $0[written...])) }) {
            case .moved(let count):
                written += count
            case .wouldBlock:
                // TLS may want to read first (rare): readability is watched all along, and the retry comes either way.
                if !watchingWritable { setWritableInterest(true) }
                return
            case .closedByPeer:
                return fail(RedisError(.connection, "\(address): connection closed by the server"))
            case .failed(let message):
                return fail(RedisError(.connection, "\(address): \(message)"))
            }
        }
        // A multi-megabyte pipeline should not pin its buffer for the life of the connection.
        if output.capacity > 1 << 20 { output = [] } else { output.removeAll(keepingCapacity: true) }
        written = 0
        if watchingWritable { setWritableInterest(false) }
    }

    private func setWritableInterest(_ on: Bool) {
        watchingWritable = on
        if !loop.watch(fd, for: on ? [.readable, .writable] : .readable, client: self) {
            fail(RedisError(.connection, "cannot watch the Redis socket: \(String(cString: strerror(errno)))"))
        }
    }

    private func readReplies() {
        let current = generation
        while let stream {
            let count: Int
            switch stream.read(into: input) {
            case .moved(let moved): count = moved
            case .wouldBlock: return
            case .closedByPeer: return fail(RedisError(.connection, "\(address): connection closed by the server"))
            case .failed(let message): return fail(RedisError(.connection, "\(address): \(message)"))
            }
            guard let feeding = reader,
                  redisReaderFeed(feeding, input.baseAddress?.assumingMemoryBound(to: CChar.self), count) == REDIS_OK else {
                return fail(RedisError(.protocol, "\(address): hiredis could not buffer the reply"))
            }
            // A reply can fail the connection (a refused AUTH): the generation then moves on and the reader is gone.
            while current == generation, let reader {
                var raw: UnsafeMutableRawPointer?
                guard redisReaderGetReply(reader, &raw) == REDIS_OK else {
                    let message = withUnsafeBytes(of: reader.pointee.errstr) {
                        String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self)
                    }
                    return fail(RedisError(.protocol, "\(address): \(message)"))
                }
                guard let raw else { break }
                let value = RedisConnection.value(raw.assumingMemoryBound(to: redisReply.self))
                freeReplyObject(raw)
                deliver(value)
            }
            // In clear, a buffer not filled was all there was. TLS hands over one record a read: read on until it
            // would block, so nothing is left decrypted inside OpenSSL with the socket quiet.
            guard current == generation, stream.isSecured || count == input.count else { return }
        }
    }

    private func deliver(_ value: RedisValue) {
        if handshakeLeft > 0 {
            let index = handshake.commandCount - handshakeLeft
            handshakeLeft -= 1
            if case .error(let message) = value { return fail(configuration.handshakeError(replyAt: index, message)) }
            if handshakeLeft == 0, !held.isEmpty {
                output.append(contentsOf: held)
                held = []
                flush()
            }
            return
        }
        guard head < waiting.count else {
            return fail(RedisError(.protocol, "\(address): a reply arrived with no call waiting"))
        }
        if !isHealthy {
            isHealthy = true
            logger.info("redis connection restored", ["redis.addr": configuration.description, "redis.connection": "loop"])
        }
        if waiting[head].replyCount == 1 {
            let completion = waiting[head].completion
            popHead()
            return completion.succeed(single: value)
        }
        waiting[head].replies.append(value)
        guard waiting[head].replies.count == waiting[head].replyCount else { return }
        let done = waiting[head]
        popHead()
        done.completion.succeed(done.replies)
    }

    private func popHead() {
        queuedCommands -= waiting[head].replyCount
        head += 1
        if head == waiting.count {
            waiting.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 1_024 {
            waiting.removeFirst(head)
            head = 0
        }
    }

    // MARK: Failing

    /// Closes the socket and fails every waiting call with `error`; the next call opens a new connection.
    private func fail(_ error: RedisError, log: Bool = true) {
        closeSocket()
        phase = .idle
        generation += 1
        handshakeLeft = 0
        output = []
        held = []
        written = 0
        let failed = waiting[head...]
        waiting = []
        head = 0
        queuedCommands = 0
        // One line per outage, not per failed call: a down Redis would otherwise flood the log.
        if log, isHealthy {
            isHealthy = false
            logger.warning("redis connection failed", ["redis.addr": configuration.description,
                                                       "redis.connection": "loop", "error": error.message])
        }
        for call in failed { call.completion.fail(error) }
    }

    private func closeSocket() {
        if fd >= 0 {
            loop.unwatch(fd)
            if let stream { stream.close() } else { Glibc.close(fd) }
            fd = -1
        }
        stream = nil
        watchingWritable = false
        if let reader { redisReaderFree(reader) }
        reader = nil
    }
}

/// A resolved socket address (`sockaddr_in` or `sockaddr_in6` bytes).
struct SocketAddress: Sendable {
    var family: Int32
    var bytes: [UInt8]

    /// No delay (each turn's writes are already batched) and keep-alive probes, as hiredis sets them.
    static func tune(_ descriptor: Int32) {
        var on: Int32 = 1
        let size = socklen_t(MemoryLayout<Int32>.size)
        _ = setsockopt(descriptor, Int32(IPPROTO_TCP), TCP_NODELAY, &on, size)
        _ = setsockopt(descriptor, SOL_SOCKET, SO_KEEPALIVE, &on, size)
        var idle: Int32 = 15
        _ = setsockopt(descriptor, Int32(IPPROTO_TCP), TCP_KEEPIDLE, &idle, size)
        var interval: Int32 = 5
        _ = setsockopt(descriptor, Int32(IPPROTO_TCP), TCP_KEEPINTVL, &interval, size)
        var probes: Int32 = 3
        _ = setsockopt(descriptor, Int32(IPPROTO_TCP), TCP_KEEPCNT, &probes, size)
    }

    /// `getaddrinfo` for TCP; with `numericOnly`, only an IP address literal is accepted (and nothing blocks).
    static func resolve(_ host: String, port: Int, numericOnly: Bool) -> [SocketAddress]? {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = numericOnly ? AI_NUMERICHOST | AI_NUMERICSERV : AI_NUMERICSERV
        var list: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &list) == 0, let list else { return nil }
        defer { freeaddrinfo(list) }
        var addresses: [SocketAddress] = []
        var entry: UnsafeMutablePointer<addrinfo>? = list
        while let current = entry {
            if let raw = current.pointee.ai_addr {
                let bytes = Array(UnsafeRawBufferPointer(start: raw, count: Int(current.pointee.ai_addrlen)))
                addresses.append(SocketAddress(family: current.pointee.ai_family, bytes: bytes))
            }
            entry = current.pointee.ai_next
        }
        return addresses.isEmpty ? nil : addresses
    }
}
