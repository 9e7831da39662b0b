import HeraldRuntime
import Synchronization

/// Settings of an `HTTPServer`. Executables fill it from `HERALD_*` variables; defaults suit the ingest API.
public struct HTTPServerConfiguration: Sendable {
    /// Where to listen, e.g. `0.0.0.0:8080`; port 0 picks a free port (see `HTTPServer.localAddress`).
    public var address: HostPort
    /// Worker threads, each with its own epoll loop and connections. Handler tasks prefer the thread that
    /// read their request as executor, so handlers must never block (await instead).
    public var threads: Int
    /// Largest request body accepted; larger ones get 413 `body_too_large`. Default 64 KiB.
    public var maxBodyBytes: Int
    /// A connection on which nothing moves either way for this long is closed (checked every 100 ms). A connection
    /// whose handler is running is exempt: `requestDeadline` bounds that. Default 30 s.
    public var connectionTimeout: Duration
    /// A whole request (headers and body) must be in within this long of its connection opening or of the
    /// previous response, however slowly it trickles; otherwise the connection is closed (slow-loris defence:
    /// the idle timeout alone is reset by every byte). Also bounds how long a keep-alive connection idles.
    /// Default 30 s.
    public var requestReadTimeout: Duration
    /// Connections beyond this many wait in the kernel's accept queue until one closes. Default 1024.
    public var maxConnections: Int
    /// Connections from one client address beyond this many are closed as soon as they are accepted, across
    /// all worker threads; 0 = no such limit (the default: behind a proxy every client shares its address).
    public var maxConnectionsPerAddress: Int
    /// For `maxConnectionsPerAddress`, IPv6 clients count per network of this prefix length (a subscriber gets a
    /// whole /64, so counting single addresses would limit nothing). Default 64; 128 counts single addresses.
    public var ipv6PrefixLength: Int
    /// A handler still running after this long is answered 503 `unavailable` and its task cancelled.
    /// Default 10 s.
    public var requestDeadline: Duration
    /// On shutdown, how long in-flight requests may take to finish before they are answered 503. Default 10 s.
    public var shutdownGracePeriod: Duration
    /// One "request" line per finished request at info level. Default on.
    public var accessLog: Bool

    public init(address: HostPort, threads: Int = 2, maxBodyBytes: Int = 65_536,
                connectionTimeout: Duration = .seconds(30), requestReadTimeout: Duration = .seconds(30),
                maxConnections: Int = 1024, maxConnectionsPerAddress: Int = 0, ipv6PrefixLength: Int = 64,
                requestDeadline: Duration = .seconds(10), shutdownGracePeriod: Duration = .seconds(10),
                accessLog: Bool = true) {
        self.address = address
        self.threads = threads
        self.maxBodyBytes = maxBodyBytes
        self.connectionTimeout = connectionTimeout
        self.requestReadTimeout = requestReadTimeout
        self.maxConnections = maxConnections
        self.maxConnectionsPerAddress = maxConnectionsPerAddress
        self.ipv6PrefixLength = ipv6PrefixLength
        self.requestDeadline = requestDeadline
        self.shutdownGracePeriod = shutdownGracePeriod
        self.accessLog = accessLog
    }
}

/// Why the server could not start.
public struct HTTPServerError: Error, Sendable, CustomStringConvertible {
    public enum Code: Sendable, Equatable {
        /// A setting is out of range.
        case invalidConfiguration
        /// The host does not resolve.
        case invalidAddress
        /// The address is taken or not ours to bind.
        case bindFailed
        /// The worker loops could not start (epoll, eventfd or dup failed).
        case startFailed
        /// `run()` was called a second time.
        case alreadyRunning
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
}

/// The HTTP/1.1 server of herald-ingest's API and of the dispatcher's health and metrics port: our own
/// implementation (one epoll loop per worker thread, keep-alive, pipelining, chunked bodies) with async handlers.
///
/// The socket is bound in `init`, so a taken port fails at start-up and `localAddress` is known before `run()`.
/// `run()` serves until its task is cancelled, then shuts down gracefully: it stops accepting, lets in-flight
/// requests finish within `shutdownGracePeriod` (answering `Connection: close` meanwhile), answers 503 to any
/// still running, and stops.
///
/// Every request gets an `X-Request-ID` (the client's when sane), one JSON access-log line (route pattern, never
/// the raw path) and the metrics `herald_http_requests_total{route,method,status}` and
/// `herald_http_request_duration_seconds{route}`.
public final class HTTPServer: Service {
    public let configuration: HTTPServerConfiguration
    /// The bound address, with the real port when port 0 was configured.
    public var localAddress: HostPort { socket.localAddress }

    /// Requests read or being answered right now (for tests and the drain).
    var inFlightRequests: Int { engine.inFlight }

    private let socket: ListeningSocket
    private let engine: RequestEngine
    private let started = Atomic<Bool>(false)

    public init(configuration: HTTPServerConfiguration, router: Router, logger: Logger,
                metrics: MetricsRegistry = .shared) throws(HTTPServerError) {
        guard configuration.threads >= 1, configuration.maxBodyBytes >= 0, configuration.maxConnections >= 1,
              configuration.maxConnectionsPerAddress >= 0, (1...128).contains(configuration.ipv6PrefixLength),
              configuration.requestReadTimeout > .zero else {
            throw HTTPServerError(.invalidConfiguration,
                                  "threads and maxConnections must be at least 1, the read timeout positive, the IPv6 prefix length 1–128")
        }
        self.configuration = configuration
        socket = try ListeningSocket(binding: configuration.address)
        engine = RequestEngine(router: router, configuration: configuration, logger: logger, metrics: metrics)
    }

    public func run() async throws {
        guard !started.exchange(true, ordering: .acquiringAndReleasing), let descriptor = socket.take() else {
            throw HTTPServerError(.alreadyRunning, "the server at \(localAddress) is already running")
        }
        let daemon = try HTTPWorkers(listening: descriptor, configuration: configuration, engine: engine)
        engine.logger.info("http server listening", ["http.addr": localAddress.description])

        // Serve until cancelled, answering overdue handlers every tick (one sweep instead of a timer per request).
        while !Task.isCancelled {
            try? await Task.sleep(for: .milliseconds(100))
            daemon.expireOverdue()
        }
        // Cancelled: `Task.sleep` would return at once from here on, so the drain waits in a fresh task.
        await Task { await self.shutDown(daemon) }.value
    }

    private func shutDown(_ daemon: HTTPWorkers) async {
        let started = ContinuousClock.now
        engine.logger.info("http server draining", ["http.in_flight": "\(engine.inFlight)"])
        daemon.quiesce()
        let deadline = started + configuration.shutdownGracePeriod
        while engine.inFlight > 0, ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(10))
        }
        let abandoned = daemon.failParked()
        if abandoned > 0 {
            engine.logger.warning("requests still running at shutdown answered 503", ["http.count": "\(abandoned)"])
            // Give the 503s a moment to go out before the connections are closed.
            let flush = ContinuousClock.now + .seconds(1)
            while engine.inFlight > 0, ContinuousClock.now < flush { try? await Task.sleep(for: .milliseconds(10)) }
        }
        daemon.stop()
        let elapsed = ContinuousClock.now - started
        engine.logger.info("http server stopped", ["http.drain_ms": "\(elapsed.inMilliseconds)"])
    }
}
