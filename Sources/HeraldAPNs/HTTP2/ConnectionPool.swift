import Foundation
import HeraldRuntime

/// The connections of one (provider key, endpoint) and the requests waiting for a free stream. Loop thread only.
///
/// Keeps `connectionsPerEndpoint` connections open (opened staggered, replaced after GOAWAY, reconnected with
/// exponential backoff after a failure) and hands queued requests to the least busy connection with a free
/// stream.
final class ConnectionPool {
    private struct Slot {
        var connection: HTTP2Connection?
        var openAt: ContinuousClock.Instant
        var opened = false
    }

    let key: PoolKey
    private unowned let core: ClientCore
    private let logger: Logger
    private var slots: [Slot]
    private var draining: [HTTP2Connection] = []
    private var queue: [PendingRequest] = []
    private var queueHead = 0
    private var consecutiveFailures = 0
    private var dispatchNeeded = false
    /// When a request last came in (see `APNsConfiguration.idlePoolLifetime`).
    private(set) var lastUsed = ContinuousClock.now

    init(key: PoolKey, core: ClientCore, logger: Logger) {
        self.key = key
        self.core = core
        self.logger = logger.with(["apns.endpoint": key.endpoint.description, "apns.key_id": key.keyID])
        let now = ContinuousClock.now
        let stagger = core.configuration.connectionStagger
        slots = (0..<max(1, core.configuration.connectionsPerEndpoint)).map { index in
            Slot(openAt: now + stagger * index)
        }
    }

    var queuedCount: Int { queue.count - queueHead }

    var connections: [HTTP2Connection] { slots.compactMap(\.connection) + draining }

    var inFlight: Int { connections.reduce(0) { $0 + $1.activeStreams } }

    func enqueue(_ request: PendingRequest) {
        guard queuedCount < core.configuration.maximumQueuedRequests else {
            return request.fail(.queueFull, "\(queuedCount) requests already wait for \(key.endpoint)")
        }
        queue.append(request)
        lastUsed = .now
        needsDispatch()
    }

    /// Puts back a request the server did not process, ahead of the queue: it is older than anything waiting.
    func retry(_ request: PendingRequest) {
        guard !core.isShuttingDown else { return request.fail(.shutdown, "the APNs client is shutting down") }
        if queueHead > 0 {
            queueHead -= 1
            queue[queueHead] = request
        } else {
            queue.insert(request, at: 0)
        }
        needsDispatch()
    }

    func needsDispatch() {
        guard !dispatchNeeded else { return }
        dispatchNeeded = true
        core.markDirty(self)
    }

    /// Hands queued requests to connections with free streams.
    func dispatch() {
        dispatchNeeded = false
        while queueHead < queue.count {
            let request = queue[queueHead]
            if request.isDone {
                queueHead += 1
                continue
            }
            guard let connection = leastBusyConnection() else { break }
            if connection.submit(request) {
                queueHead += 1
            }
        }
        compactQueue()
    }

    private func leastBusyConnection() -> HTTP2Connection? {
        var best: HTTP2Connection?
        for slot in slots {
            guard let connection = slot.connection, connection.hasCapacity else { continue }
            if best == nil || connection.activeStreams < best!.activeStreams { best = connection }
        }
        return best
    }

    private func compactQueue() {
        if queueHead == queue.count {
            queue.removeAll(keepingCapacity: queue.count <= 4096)
            queueHead = 0
        } else if queueHead > 1024, queueHead * 2 > queue.count {
            queue.removeFirst(queueHead)
            queueHead = 0
        }
    }

    /// Opens due connections, expires queued requests, and lets connections check their own timers.
    func tick(now: ContinuousClock.Instant, opening: Bool) {
        if opening {
            for index in slots.indices where slots[index].connection == nil && slots[index].openAt <= now {
                open(index)
            }
        }
        // One timeout for all requests, so the queue is ordered by deadline: only its head can have expired.
        while queueHead < queue.count, queue[queueHead].isDone || queue[queueHead].deadline <= now {
            queue[queueHead].fail(.timeout, "no free stream to \(key.endpoint) within \(core.configuration.requestTimeout)")
            queueHead += 1
        }
        compactQueue()
        for connection in connections { connection.tick(now: now) }
    }

    private func open(_ index: Int) {
        if slots[index].opened { core.metrics.reconnects.increment() }
        slots[index].opened = true
        let connection = HTTP2Connection(id: core.nextConnectionID(), endpoint: key.endpoint, pool: self, core: core,
                                         logger: logger)
        slots[index].connection = connection
        connection.start()
    }

    func connectionBecameReady(_ connection: HTTP2Connection) {
        core.metrics.connections.add(1)
        logger.info("APNs connection ready", ["apns.connection": String(connection.id),
                                              "apns.max_concurrent_streams": String(connection.remoteMaximumStreams)])
        // The next connection opens now rather than when its stagger is due: connects stay one at a time, and a
        // new pool reaches full width within a few handshakes.
        if !core.isShuttingDown, let next = slots.firstIndex(where: { !$0.opened }) { open(next) }
        needsDispatch()
    }

    /// After GOAWAY, a 503 Shutdown or running out of stream ids: no new streams there. A replacement opens now,
    /// or after the backoff when the server dropped the connection before it answered anything (a server that
    /// sends GOAWAY to every new connection must not get a connect loop at handshake speed).
    func connectionStartedDraining(_ connection: HTTP2Connection) {
        guard let index = slots.firstIndex(where: { $0.connection === connection }) else { return }
        slots[index].connection = nil
        if wasHealthy(connection) {
            consecutiveFailures = 0
            slots[index].openAt = .now
        } else {
            slots[index].openAt = .now + backoff()
            consecutiveFailures += 1
            // As for a connection that failed before it was ready: nothing can carry the queue now. (One that
            // answered 503 Shutdown worked as far as it went: the queue waits for its replacement.)
            if !connection.answeredAnything, !slots.contains(where: { $0.connection?.state == .ready }) {
                failQueue(APNsError(.connectionFailed, "\(key.endpoint) dropped the connection before answering anything"
                                    + connection.goawayNote))
            }
        }
        draining.append(connection)
        if connection.activeStreams == 0 { core.markDirty(connection) }
    }

    func connectionClosed(_ connection: HTTP2Connection, error: APNsError?) {
        if connection.wasReady { core.metrics.connections.add(-1) }
        draining.removeAll { $0 === connection }
        if let index = slots.firstIndex(where: { $0.connection === connection }) {
            if wasHealthy(connection) { consecutiveFailures = 0 }
            slots[index].connection = nil
            slots[index].openAt = .now + backoff()
            consecutiveFailures += 1
        }
        // Nothing here can carry the queue now and this attempt failed before it was usable: fail fast rather
        // than let every queued request wait out its timeout (the caller retries with its own backoff).
        if let error, !connection.wasReady, !slots.contains(where: { $0.connection?.state == .ready }) {
            failQueue(error)
        }
        needsDispatch()
    }

    /// A connection that answered a request, or stayed ready a minute, worked: the failures before it are over.
    private func wasHealthy(_ connection: HTTP2Connection) -> Bool {
        connection.hasAnswered || connection.readyAt.map { .now - $0 >= .seconds(60) } ?? false
    }

    private func backoff() -> Duration {
        let exponential = core.configuration.reconnectInitialDelay * (1 << min(consecutiveFailures, 20))
        let delay = min(core.configuration.reconnectMaximumDelay, exponential)
        // ±20% jitter so a fleet of dispatchers does not reconnect in lockstep.
        return delay * Double.random(in: 0.8...1.2)
    }

    func failQueue(_ error: APNsError) {
        while queueHead < queue.count {
            queue[queueHead].resolve(.failure(error))
            queueHead += 1
        }
        compactQueue()
    }

    /// Drops a cancelled request from wherever it is.
    func cancel(_ request: PendingRequest) {
        for connection in connections { connection.cancel(request) }
    }

    /// True when nothing waits or is in flight and nothing came in for `idlePoolLifetime`.
    func isIdle(now: ContinuousClock.Instant) -> Bool {
        queuedCount == 0 && inFlight == 0 && now - lastUsed >= core.configuration.idlePoolLifetime
    }

    /// Closes every connection (GOAWAY first). The core has forgotten the pool, so nothing reopens them.
    func retire() {
        for connection in connections { connection.terminate(failing: APNsError(.shutdown, "the pool was idle")) }
    }

    /// Closes connections that are still being established (used at shutdown).
    func abandonUnready(_ error: APNsError) {
        for connection in connections where connection.state != .ready && connection.state != .draining {
            connection.close(error)
        }
    }
}
