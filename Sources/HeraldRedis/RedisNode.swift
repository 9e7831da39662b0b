import Foundation
import HeraldRuntime

/// The connections to one Redis server, for many concurrent tasks: a pool of `poolSize` connections, each driven
/// by a thread the node owns, so blocking hiredis calls never occupy Swift's cooperative pool. `RedisClient`
/// routes calls to one node (standalone) or to the node serving each key's slot (cluster).
///
/// Calls made concurrently are pipelined automatically: a connection thread writes every queued command at once
/// and then reads the replies. Every call has a deadline (`commandTimeout`, counted from the call): past it the
/// call throws `RedisError.Code.timeout` and the connection it waited on is reset. A connection that broke (Redis
/// restarted, network cut) is reopened by the next call, so one node lives as long as the process.
///
/// A call made on the thread of a `ThreadEventLoop` (an HTTP handler on herald's worker loops) does not use the
/// pool: it goes over a non-blocking connection of this node's own on that loop, written and read by the loop
/// itself, so the caller never waits for another thread. Each loop opens one such connection on its first call;
/// deadlines, reconnection, `maxQueuedCommands` and the error kinds are the same on both paths.
///
/// Replies come back as they are, error replies included: checking them is the client's.
final class RedisNode: Sendable {
    let configuration: RedisConfiguration
    private let queue: RedisRequestQueue
    private let loopConnections = LoopConnections()
    private let logger: Logger

    /// Starts the connection threads. Connections open lazily, on the first call each thread serves, so a node can
    /// be created while Redis is still down.
    init(configuration: RedisConfiguration, logger: Logger) {
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
            let thread = Thread.named("herald-redis-\(index)") { worker.run() }
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
    func close() async {
        loopConnections.closeAll()
        queue.shutdown()
        await queue.waitUntilStopped()
    }

    var address: RedisAddress { RedisAddress(host: configuration.host, port: configuration.port) }

    /// Sends one encoded command and returns its reply.
    func single(_ encoder: RESPEncoder) async throws -> RedisValue {
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

    /// Sends the encoded commands together on one connection and returns their replies in order.
    func many(_ encoder: RESPEncoder) async throws -> [RedisValue] {
        try await withCheckedThrowingContinuation { continuation in submit(encoder, completion: .many(continuation)) }
    }

    /// Sends the encoded commands together on one connection; `completion` gets their replies in order.
    func submit(_ encoder: RESPEncoder, completion: RedisRequest.Completion) {
        let deadline = ContinuousClock.now + configuration.commandTimeout
        if let connection = loopConnection() {
            return connection.submit(encoder.bytes, replyCount: encoder.commandCount, deadline: deadline,
                                     completion: completion)
        }
        let request = RedisRequest(payload: encoder.bytes, replyCount: encoder.commandCount, deadline: deadline,
                                   completion: completion)
        if let error = queue.enqueue(request) { completion.fail(error) }
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
    var loopConnectionCount: Int { loopConnections.count }
}
