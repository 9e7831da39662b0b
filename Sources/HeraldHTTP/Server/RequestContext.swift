import HeraldRuntime
import Synchronization

/// One request's state from its parsed head to the end of its response.
///
/// The connection owns it while the request is read and answered; a parked request's handler task, the deadline
/// sweep and shutdown hold references too, so a context outlives a client that disconnects mid-handler. Whoever
/// answers a parked request first claims it and hands the response to the connection's loop.
// @unchecked: `connection` and the receive-side vars are only touched on the connection's loop thread (the loop
// reads the request and writes the response); other threads touch the atomic claim and `handlerTask`, which is
// only read or written under the lock of the context's `ParkedRequests` shard.
final class RequestContext: @unchecked Sendable {
    let loop: WorkerLoop
    let connection: HTTPConnection
    let started: ContinuousClock.Instant
    let method: String
    /// Percent-encoded path without the query.
    let path: String
    let requestID: String
    let match: Router.Match
    /// HEAD: the response goes out without its body.
    let headOnly: Bool

    var body: [UInt8] = []
    /// Body bytes received, including those discarded after the limit was crossed.
    var received = 0
    var tooLarge = false
    /// Status and size of the queued response; 0 until one is queued.
    var status = 0
    var bytesOut = 0

    /// Set by whoever answers a parked request first (its handler, the deadline sweep, shutdown); only the winner
    /// hands a response to the loop.
    let claimed = Atomic<Bool>(false)
    /// The handler task of a parked request, cancelled when the deadline sweep or shutdown answers for it. Guarded
    /// by the context's `ParkedRequests` shard lock (not a lock of its own: two allocations less per request).
    var handlerTask: Task<Void, Never>?

    /// Claims the right to answer a parked request. True exactly once.
    func claim() -> Bool {
        claimed.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
    }

    init(loop: WorkerLoop, connection: HTTPConnection, method: String, path: String, requestID: String,
         match: Router.Match) {
        self.loop = loop
        self.connection = connection
        started = .now
        self.method = method
        self.path = path
        self.requestID = requestID
        self.match = match
        routeLabel = switch match {
        case .found(let route, _): route.pattern
        case .methodNotAllowed(let pattern, _): pattern
        case .notFound: RequestEngine.unmatchedRoute
        }
        headOnly = method == "HEAD"
    }

    /// The route pattern for logs and metrics (set once: reading it out of `match` copied the whole match).
    let routeLabel: String
}
