internal import CMicroHTTPD
import HeraldRuntime
import Synchronization

/// One request's state between libmicrohttpd's first access-handler call and its request-completed callback.
///
/// libmicrohttpd keeps it in the connection's per-request slot (`con_cls`) as a +1 `Unmanaged` reference, taken
/// back in the completed callback. A parked request's handler task holds its own reference, so a context outlives
/// a client that disconnects mid-handler; the connection pointer is only used while the connection is suspended
/// (libmicrohttpd neither reads, times out nor closes a suspended connection) or on its own worker thread.
// @unchecked: the receive-side vars are only touched on the connection's worker thread (libmicrohttpd calls a
// connection's callbacks from one thread); the fields shared with other threads are atomics and mutexes.
final class RequestContext: @unchecked Sendable {
    let connection: OpaquePointer
    let started: ContinuousClock.Instant
    let method: String
    /// Percent-encoded path without the query.
    let path: String
    let requestID: String
    let match: Router.Match

    var body: [UInt8] = []
    /// Body bytes received, including those discarded after the limit was crossed.
    var received = 0
    var tooLarge = false
    /// Status and size of the queued response; 0 until one is queued.
    var status = 0
    var bytesOut = 0

    /// Set by whoever answers a parked request first (its handler, the deadline sweep, shutdown); only the winner
    /// stores a response and resumes the connection.
    let claimed = Atomic<Bool>(false)
    /// What other threads hand over, under one lock (a lock is two allocations, and every request makes a context).
    let shared = Lock(Shared())

    struct Shared {
        /// Set by the claim winner before it resumes the connection.
        var pendingResponse: HTTPResponse?
        /// The handler task of a parked request, cancelled when the deadline sweep or shutdown answers for it.
        var handlerTask: Task<Void, Never>?
    }

    /// Claims the right to answer a parked request. True exactly once.
    func claim() -> Bool {
        claimed.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
    }

    init(connection: OpaquePointer, method: String, path: String, requestID: String, match: Router.Match) {
        self.connection = connection
        started = .now
        self.method = method
        self.path = path
        self.requestID = requestID
        self.match = match
    }

    /// The route pattern for logs and metrics.
    var routeLabel: String {
        switch match {
        case .found(let route, _): route.pattern
        case .methodNotAllowed(let pattern, _): pattern
        case .notFound: RequestEngine.unmatchedRoute
        }
    }
}
