import Foundation
import HeraldRuntime
import HeraldTLS

/// The client's metrics (Prometheus names under `herald_apns_`).
struct APNsMetrics: Sendable {
    let pushes: CounterFamily
    let inFlight: Gauge
    let latency: Histogram
    let connections: Gauge
    let reconnects: Counter
    let delivered: Counter

    init(_ registry: MetricsRegistry) {
        pushes = registry.counter("herald_apns_pushes_total", help: "APNs requests by HTTP status (or local error) and reason",
                                  labels: ["status", "reason"])
        inFlight = registry.gauge("herald_apns_in_flight", help: "APNs requests sent or queued, not yet answered").labels()
        latency = registry.histogram("herald_apns_push_duration_seconds", help: "Time from send to APNs answer").labels()
        connections = registry.gauge("herald_apns_connections", help: "Open, ready APNs HTTP/2 connections").labels()
        reconnects = registry.counter("herald_apns_reconnects_total",
                                      help: "APNs connections opened to replace a failed, lost or drained one").labels()
        delivered = pushes.labels("200", "")
    }
}

/// Everything the event loop owns: pools, the shared read buffer, dirty lists, shutdown. Loop thread only.
final class ClientCore: @unchecked Sendable {  // @unchecked: every method runs on the loop thread (posted through `loop.execute`).
    let configuration: APNsConfiguration
    let loop: EventLoop
    private let systemTLS: TLSContext
    private let extraTLS: TLSContext?
    let metrics: APNsMetrics
    private let logger: Logger
    let readBuffer = UnsafeMutableBufferPointer<UInt8>.allocate(capacity: 65_536)
    private var pools: [PoolKey: ConnectionPool] = [:]
    private var dirtyPools: [ConnectionPool] = []
    private var dirtyConnections: [HTTP2Connection] = []
    private var connectionCounter = 0
    private var shutdownDeadline: ContinuousClock.Instant?

    init(configuration: APNsConfiguration, loop: EventLoop, systemTLS: TLSContext, extraTLS: TLSContext?,
         metrics: APNsMetrics, logger: Logger) {
        self.configuration = configuration
        self.loop = loop
        self.systemTLS = systemTLS
        self.extraTLS = extraTLS
        self.metrics = metrics
        self.logger = logger
    }

    deinit { readBuffer.deallocate() }

    /// The trust to verify `endpoint` with: the system store for Apple's hosts, the system store plus the extra CA
    /// for the other configured hosts.
    func tls(for endpoint: APNsEndpoint) -> TLSContext {
        endpoint.isApple ? systemTLS : extraTLS ?? systemTLS
    }

    var isShuttingDown: Bool { shutdownDeadline != nil }

    func nextConnectionID() -> Int {
        connectionCounter += 1
        return connectionCounter
    }

    func enqueue(_ request: PendingRequest) {
        request.enqueued = true
        if request.cancelled { return request.resolve(.failure(CancellationError())) }
        guard shutdownDeadline == nil else { return request.fail(.shutdown, "the APNs client is shutting down") }
        let pool: ConnectionPool
        if let existing = pools[request.poolKey] {
            pool = existing
        } else {
            pool = ConnectionPool(key: request.poolKey, core: self, logger: logger)
            pools[request.poolKey] = pool
            pool.tick(now: .now, opening: true)
        }
        pool.enqueue(request)
    }

    func cancel(_ request: PendingRequest) {
        request.cancelled = true
        // Posted before the request itself reached the loop (both come through the inbox): `enqueue` sees the flag.
        guard !request.isDone, request.enqueued else { return }
        pools[request.poolKey]?.cancel(request)
        request.resolve(.failure(CancellationError()))
    }

    func markDirty(_ pool: ConnectionPool) { dirtyPools.append(pool) }

    func markDirty(_ connection: HTTP2Connection) {
        guard !connection.isDirty else { return }
        connection.isDirty = true
        dirtyConnections.append(connection)
    }

    /// After each batch: hand queued requests to streams, then write everything out once.
    func afterBatch() {
        while !dirtyPools.isEmpty || !dirtyConnections.isEmpty {
            let pools = dirtyPools
            dirtyPools.removeAll(keepingCapacity: true)
            for pool in pools { pool.dispatch() }
            let connections = dirtyConnections
            dirtyConnections.removeAll(keepingCapacity: true)
            for connection in connections { connection.flush() }
        }
        if shutdownDeadline != nil { finishShutdownIfDone(now: nil) }
    }

    func tick(now: ContinuousClock.Instant) {
        for (key, pool) in pools where pool.isIdle(now: now) {
            pools[key] = nil
            pool.retire()
            logger.info("APNs pool idle: connections closed", ["apns.endpoint": key.endpoint.description,
                                                               "apns.key_id": key.keyID])
        }
        for pool in pools.values { pool.tick(now: now, opening: shutdownDeadline == nil) }
        if shutdownDeadline != nil { finishShutdownIfDone(now: now) }
    }

    // MARK: Shutdown

    /// Refuses new requests, fails queued ones, lets in-flight ones finish until `gracePeriod` has passed, then
    /// sends GOAWAY on every connection, fails what is left and stops the loop.
    func beginShutdown(gracePeriod: Duration) {
        guard shutdownDeadline == nil else { return }
        shutdownDeadline = .now + gracePeriod
        let error = APNsError(.shutdown, "the APNs client is shutting down")
        for pool in pools.values {
            pool.failQueue(error)
            pool.abandonUnready(error)
        }
        finishShutdownIfDone(now: .now)
    }

    private func finishShutdownIfDone(now: ContinuousClock.Instant?) {
        guard let deadline = shutdownDeadline else { return }
        let busy = pools.values.contains { $0.inFlight > 0 }
        if busy, (now ?? .now) < deadline { return }
        let error = APNsError(.shutdown, "the APNs client shut down before APNs answered")
        for pool in pools.values {
            for connection in pool.connections { connection.terminate(failing: error) }
        }
        pools.removeAll()
        dirtyPools.removeAll()
        dirtyConnections.removeAll()
        loop.stop()
    }

    // MARK: Diagnostics

    func snapshot() -> [APNsConnectionInfo] {
        pools.values.flatMap { pool in
            pool.connections.map { connection in
                APNsConnectionInfo(endpoint: pool.key.endpoint, keyID: pool.key.keyID, state: connection.state.rawValue,
                                   maximumConcurrentStreams: connection.remoteMaximumStreams,
                                   activeStreams: connection.activeStreams,
                                   peakActiveStreams: connection.peakActiveStreams,
                                   streamsOpened: connection.streamsOpened)
            }
        }
    }
}

/// A view of one connection, for diagnostics and tests.
public struct APNsConnectionInfo: Sendable, Equatable {
    public let endpoint: APNsEndpoint
    public let keyID: String
    /// resolving, connecting, handshaking, awaitingSettings, ready, draining.
    public let state: String
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS as last received.
    public let maximumConcurrentStreams: Int
    public let activeStreams: Int
    /// The most streams that were open at once on this connection.
    public let peakActiveStreams: Int
    public let streamsOpened: Int
}
