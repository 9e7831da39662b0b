import Foundation
import HeraldRuntime

/// A Redis client for many concurrent tasks: a pool of `poolSize` connections, each driven by a thread the client
/// owns, so blocking hiredis calls never occupy Swift's cooperative pool.
///
/// Calls made concurrently are pipelined automatically: a connection thread writes every queued command at once
/// and then reads the replies. Every call has a deadline (`commandTimeout`, counted from the call): past it the
/// call throws `RedisError.Code.timeout` and the connection it waited on is reset. A connection that broke (Redis
/// restarted, network cut) is reopened by the next call, so one client lives as long as the process.
///
/// A call made on the thread of a `ThreadEventLoop` (an HTTP handler on herald's worker loops) does not use the
/// pool: it goes over a non-blocking connection of this client's own on that loop, written and read by the loop
/// itself, so the caller never waits for another thread. Each loop opens one such connection on its first call;
/// deadlines, reconnection, `maxQueuedCommands` and the error kinds are the same on both paths.
///
/// A call that fails with a connection error may or may not have been executed by Redis. Cancelling the calling
/// task does not withdraw a queued call; its deadline bounds the wait. Blocking commands (`BLPOP`) hold a pooled
/// connection for their whole wait: give them a client of their own (and never call them on an event loop).
public final class RedisClient: Sendable {
    public let configuration: RedisConfiguration
    private let queue: RedisRequestQueue
    private let loopConnections = LoopConnections()
    private let logger: Logger

    /// Starts the connection threads. Connections open lazily, on the first call each thread serves, so a client
    /// can be created while Redis is still down.
    public init(configuration: RedisConfiguration, logger: Logger = Logger(label: "herald.redis")) {
        var configuration = configuration
        // The properties are plain vars; a pool without threads would leave every call waiting forever.
        configuration.poolSize = max(1, configuration.poolSize)
        configuration.maxQueuedCommands = max(1, configuration.maxQueuedCommands)
        self.configuration = configuration
        self.logger = logger
        queue = RedisRequestQueue(workerCount: configuration.poolSize,
                                  maxQueuedCommands: configuration.maxQueuedCommands)
        for index in 0..<configuration.poolSize {
            let worker = RedisWorker(index: index, configuration: configuration, queue: queue, logger: logger)
            let thread = Thread { worker.run() }
            thread.name = "herald-redis-\(index)"
            thread.start()
        }
    }

    /// Lets the threads exit once their queued calls are answered; they hold only the queue, not the client. The
    /// loops close their connections of this client on their next turn.
    deinit {
        loopConnections.closeAll()
        queue.shutdown()
    }

    /// Refuses new calls (they throw `.closed`), answers the queued ones, and returns when every connection thread
    /// has exited and closed its connection. Connections on event loops are closed by their loops' next turn (their
    /// waiting calls fail with `.closed`), without waiting for it.
    public func close() async {
        loopConnections.closeAll()
        queue.shutdown()
        await queue.waitUntilStopped()
    }

    /// Runs one command, e.g. `["SET", key, value, "EX", "60"]`.
    ///
    /// - Throws: `RedisError` — `.server`/`.noScript` for an error reply, or a connection failure.
    @discardableResult
    public func command(_ arguments: [String]) async throws -> RedisValue {
        var encoder = RESPEncoder()
        encoder.append(arguments)
        return try checked(await single(encoder))
    }

    /// Runs one command whose arguments are arbitrary bytes (binary keys or values).
    @discardableResult
    public func command(_ arguments: [[UInt8]]) async throws -> RedisValue {
        var encoder = RESPEncoder()
        encoder.append(arguments)
        return try checked(await single(encoder))
    }

    /// Sends the commands together on one connection, in order, and returns one reply per command.
    ///
    /// Error replies are returned in place as `RedisValue.error` so one failing command does not hide the others'
    /// replies; only connection failures throw, and `.unavailable` when Redis is not serving (`LOADING` after a
    /// restart…), which answers every command of the pipeline alike. `MULTI` … `EXEC` inside one pipeline runs as a transaction.
    @discardableResult
    public func pipeline(_ commands: [[String]]) async throws -> [RedisValue] {
        guard !commands.isEmpty else { return [] }
        var encoder = RESPEncoder(capacity: commands.count * 32)
        for command in commands { encoder.append(command) }
        return try servedReplies(await many(encoder))
    }

    /// `pipeline(_:)` for commands whose arguments are arbitrary bytes.
    @discardableResult
    public func pipeline(_ commands: [[[UInt8]]]) async throws -> [RedisValue] {
        guard !commands.isEmpty else { return [] }
        var encoder = RESPEncoder(capacity: commands.count * 32)
        for command in commands { encoder.append(command) }
        return try servedReplies(await many(encoder))
    }

    /// Runs a Lua script with `EVALSHA`; when Redis does not know it yet (`NOSCRIPT`), sends it once with `EVAL`,
    /// which also caches it for later calls.
    @discardableResult
    public func run(_ script: RedisScript, keys: [String], args: [String]) async throws -> RedisValue {
        let count = String(keys.count)
        // The call's size up to a few bytes (16 covers an argument's framing). A guess of 64 per argument reserved
        // over 1 KiB for a registration, past the sizes glibc's per-thread cache serves.
        var size = 64
        for argument in keys { size += argument.utf8.count + 16 }
        for argument in args { size += argument.utf8.count + 16 }
        var encoder = RESPEncoder(capacity: size + script.sha1.utf8.count)
        encoder.append(["EVALSHA", script.sha1, count], keys, args)
        do {
            return try checked(await single(encoder))
        } catch let error as RedisError where error.code == .noScript {
            var retry = RESPEncoder(capacity: size + script.source.utf8.count)
            retry.append(["EVAL", script.source, count], keys, args)
            return try checked(await single(retry))
        }
    }

    private func single(_ encoder: RESPEncoder) async throws -> RedisValue {
        let deadline = ContinuousClock.now + configuration.commandTimeout
        return try await withCheckedThrowingContinuation { continuation in
            if let connection = loopConnection() {
                return connection.submit(encoder.bytes, replyCount: 1, deadline: deadline,
                                         completion: .single(continuation))
            }
            let request = RedisRequest(payload: encoder.bytes, replyCount: 1, deadline: deadline,
                                       completion: .single(continuation))
            if let error = queue.enqueue(request) { continuation.resume(throwing: error) }
        }
    }

    private func many(_ encoder: RESPEncoder) async throws -> [RedisValue] {
        let deadline = ContinuousClock.now + configuration.commandTimeout
        return try await withCheckedThrowingContinuation { continuation in
            if let connection = loopConnection() {
                return connection.submit(encoder.bytes, replyCount: encoder.commandCount, deadline: deadline,
                                         completion: .many(continuation))
            }
            let request = RedisRequest(payload: encoder.bytes, replyCount: encoder.commandCount, deadline: deadline,
                                       completion: .many(continuation))
            if let error = queue.enqueue(request) { continuation.resume(throwing: error) }
        }
    }

    /// This client's connection on the event loop running the calling thread (opened lazily, one per loop); nil
    /// off the loops, or once the client is closed (the pool then answers `.closed`).
    private func loopConnection() -> LoopConnection? {
        guard let loop = LoopThread.current else { return nil }
        let key = ObjectIdentifier(loopConnections)
        if let existing = loop.value(forKey: key) { return unsafeDowncast(existing, to: LoopConnection.self) }
        let connection = LoopConnection(loop: loop, configuration: configuration, registry: loopConnections,
                                        logger: logger)
        guard loopConnections.register(connection) else { return nil }
        loop.setValue(connection, forKey: key)
        loop.attach(connection)
        return connection
    }

    /// How many event loops hold a connection of this client (for tests and diagnostics).
    public var loopConnectionCount: Int { loopConnections.count }

    private func servedReplies(_ replies: [RedisValue]) throws(RedisError) -> [RedisValue] {
        if let unavailable = replies.lazy.compactMap(RedisError.unavailability(of:)).first { throw unavailable }
        return replies
    }

    private func checked(_ reply: RedisValue) throws(RedisError) -> RedisValue {
        if case .error(let message) = reply { throw RedisError.fromReply(message) }
        return reply
    }
}
