import Foundation
import HeraldRuntime

/// The loop one pool thread runs: take a batch, make sure the connection is open, write every command of the
/// batch, then read every reply in order and resume each caller.
struct RedisWorker: Sendable {
    let index: Int
    let configuration: RedisConfiguration
    let queue: RedisRequestQueue
    let logger: Logger

    /// Runs on a thread of its own until the queue is shut down and drained; the connection dies with the loop.
    func run() {
        let connection = RedisConnection(configuration: configuration)
        var isHealthy = true
        while let batch = queue.nextBatch(worker: index) {
            process(batch, on: connection, isHealthy: &isHealthy)
        }
    }

    private func process(_ batch: [RedisRequest], on connection: RedisConnection, isHealthy: inout Bool) {
        let now = ContinuousClock.now
        var live: [RedisRequest] = []
        live.reserveCapacity(batch.count)
        // The batch waits as long as its latest caller may: an old request near its deadline must not cut the
        // connect or the replies of the fresh ones behind it short (the old one is answered late at worst, within
        // one command timeout).
        var latestDeadline = now
        for request in batch {
            if request.deadline <= now {
                request.fail(RedisError(.timeout, "waited longer than \(configuration.commandTimeout) for a connection"))
            } else {
                live.append(request)
                latestDeadline = max(latestDeadline, request.deadline)
            }
        }
        guard !live.isEmpty else { return }

        var answered = 0
        do throws(RedisError) {
            if !connection.isConnected || connection.peerHasClosed {
                let remaining = latestDeadline - now
                do throws(RedisError) {
                    try connection.connect(timeout: min(configuration.connectTimeout, remaining))
                } catch where remaining < configuration.connectTimeout && ContinuousClock.now >= latestDeadline {
                    // The connect ran out of the callers' time, not its own: to them that is a timeout.
                    throw RedisError(.timeout, "no connection to \(configuration.host):\(configuration.port) "
                                         + "within \(configuration.commandTimeout)")
                }
            }
            for request in live { connection.append(request.payload) }
            connection.setTimeout(latestDeadline - .now)
            for request in live {
                var replies: [RedisValue] = []
                replies.reserveCapacity(request.replyCount)
                for _ in 0..<request.replyCount { replies.append(try connection.readReply()) }
                request.succeed(replies)
                answered += 1
            }
            if !isHealthy {
                isHealthy = true
                logger.info("redis connection restored", ["redis.addr": configuration.description,
                                                          "redis.connection": "\(index)"])
            }
        } catch {
            for request in live[answered...] { request.fail(error) }
            // One line per outage, not per failed batch: a down Redis would otherwise flood the log.
            if isHealthy {
                isHealthy = false
                logger.warning("redis connection failed", ["redis.addr": configuration.description,
                                                           "redis.connection": "\(index)", "error": error.message])
            }
        }
    }
}
