internal import CHeraldShims
import Foundation
import HeraldRuntime

/// One thread with its own epoll set serving HTTP connections, which is also the preferred task executor of the
/// handler tasks it starts and a `ThreadEventLoop` for the Redis client's per-loop connections.
///
/// Why: a handler that does not wait on another thread runs start to finish on the thread that read its request,
/// and its response is sent (one `send`) in the same loop turn. A handler that awaits Kafka is resumed here by an
/// `enqueue` that wakes the loop; one that awaits Redis never leaves the thread: its connection's socket sits in
/// the same epoll set. Handlers must not block: a blocked handler stalls every connection of its loop.
///
/// Every loop accepts on the shared listening socket (its own `dup`, registered with EPOLLEXCLUSIVE so a new
/// connection wakes one loop) and keeps the connections it accepted for their whole life.
// @unchecked: the queue is a Lock; every other var (connections, clients, watched, storage, the listener state)
// is only touched on the loop thread, or in deinit after the thread has exited.
final class WorkerLoop: TaskExecutor, ThreadEventLoop, @unchecked Sendable {
    let parked: ParkedRequests
    var engine: RequestEngine { parked.engine }
    let epollFD: Int32
    private let wakeFD: Int32
    /// This loop's descriptor of the listening socket; -1 once closed (drain).
    private var listenFD: Int32
    /// The listening socket is in the epoll set (not while at the connection limit or closed).
    private var accepting = false
    private var acceptPausedUntil: ContinuousClock.Instant?
    private let state = Lock(LoopState())
    private let exited = DispatchSemaphore(value: 0)
    let addresses: AddressCounter
    private static let sweepInterval: Duration = .milliseconds(100)
    let readTimeout: Duration
    let idleTimeout: Duration
    private let connectionLimit: Int
    /// Every open connection of this loop, by descriptor.
    var connections: [Int32: HTTPConnection] = [:]
    private var nextSweep = ContinuousClock.now
    /// The time of the current turn (after its epoll_wait): activity stamps without a clock read per event.
    var now = ContinuousClock.now
    /// `ThreadEventLoop` clients (told at the end of each turn and when the loop stops), by identity.
    private var clients: [ObjectIdentifier: any LoopClient] = [:]
    /// Descriptors of clients that this loop's epoll set watches, and who is told of them.
    private var watched: [Int32: any LoopClient] = [:]
    private var storage: [ObjectIdentifier: AnyObject] = [:]
    /// What one epoll_wait reports (descriptors and their readiness bits), kept for the life of the loop.
    private static let readyCapacity: Int32 = 64
    private let readyDescriptors = UnsafeMutablePointer<Int32>.allocate(capacity: Int(readyCapacity))
    private let readyEvents = UnsafeMutablePointer<UInt32>.allocate(capacity: Int(readyCapacity))
    /// Metric series of finished requests, by route, method label and status (bounded: labels are). Loop thread only.
    var seriesCache: [SeriesKey: RequestEngine.Series] = [:]
    /// The Date header line of the current second, rebuilt when the second changes.
    var dateLine: [UInt8] = []
    var dateSecond = -1

    struct SeriesKey: Hashable {
        var route: String
        var methodLabel: String
        var status: Int
    }

    private struct LoopState {
        var jobs: [UnownedJob] = []
        var operations: [@Sendable () -> Void] = []
        /// The loop is in (or about to enter) epoll_wait; whoever queues work must wake it.
        var sleeping = false
        var stopping = false
        /// The thread has exited; jobs go to the global executor from now on, operations are dropped.
        var finished = false
    }

    /// Starts the loop's thread, accepting on `descriptor` (which it then owns).
    init(listening descriptor: Int32, configuration: HTTPServerConfiguration, connectionLimit: Int,
         addresses: AddressCounter, parked: ParkedRequests, name: String) throws(HTTPServerError) {
        self.parked = parked
        self.addresses = addresses
        self.connectionLimit = connectionLimit
        readTimeout = configuration.requestReadTimeout
        idleTimeout = configuration.connectionTimeout
        let epollFD = herald_epoll_create()
        let wakeFD = herald_eventfd_create()
        guard epollFD >= 0, wakeFD >= 0, herald_epoll_add_readable(epollFD, wakeFD) == 0,
              herald_epoll_add_listener(epollFD, descriptor) == 0 else {
            let reason = String(cString: strerror(errno))
            [epollFD, wakeFD, descriptor].filter { $0 >= 0 }.forEach { close($0) }
            throw HTTPServerError(.startFailed, "epoll/eventfd: \(reason)")
        }
        self.epollFD = epollFD
        self.wakeFD = wakeFD
        listenFD = descriptor
        accepting = true
        let thread = Thread.named(name) { [self] in loop() }
        thread.start()
    }

    // MARK: TaskExecutor

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        enum Action { case none, wake, forward }
        let action = state.withLock { state -> Action in
            if state.finished { return .forward }
            state.jobs.append(job)
            guard state.sleeping else { return .none }
            state.sleeping = false
            return .wake
        }
        switch action {
        case .none: break
        case .wake: wake()
        case .forward: globalConcurrentExecutor.enqueue(job)
        }
    }

    // MARK: ThreadEventLoop

    func attach(_ client: any LoopClient) { clients[ObjectIdentifier(client)] = client }

    func detach(_ client: any LoopClient) { clients[ObjectIdentifier(client)] = nil }

    func watch(_ descriptor: Int32, for interest: DescriptorEvents, client: any LoopClient) -> Bool {
        let isNew = watched[descriptor] == nil
        guard herald_epoll_watch(epollFD, descriptor, interest.rawValue, isNew ? 1 : 0) == 0 else { return false }
        watched[descriptor] = client
        return true
    }

    func unwatch(_ descriptor: Int32) {
        guard watched.removeValue(forKey: descriptor) != nil else { return }
        _ = herald_epoll_unwatch(epollFD, descriptor)
    }

    func value(forKey key: ObjectIdentifier) -> AnyObject? { storage[key] }

    func setValue(_ value: AnyObject?, forKey key: ObjectIdentifier) { storage[key] = value }

    func execute(_ operation: @escaping @Sendable () -> Void) { perform(operation) }

    // MARK: Control

    /// Runs `operation` on the loop thread at the start of a coming turn; dropped once the loop has stopped.
    func perform(_ operation: @escaping @Sendable () -> Void) {
        let shouldWake = state.withLock { state -> Bool in
            guard !state.finished else { return false }
            state.operations.append(operation)
            defer { state.sleeping = false }
            return state.sleeping
        }
        if shouldWake { wake() }
    }

    /// A parked request's response, from whichever thread answered it: written at once when that is this loop's
    /// thread (a handler that never left it), else in the loop's next turn.
    func deliver(_ response: HTTPResponse, for context: RequestContext) {
        if LoopThread.current === self {
            respond(response, for: context)
        } else {
            perform { [self] in respond(response, for: context) }
        }
    }

    /// Stops accepting (the listening descriptor is closed) and closes idle keep-alive connections; the others
    /// close after their current response, which says `Connection: close`.
    func quiesce() {
        perform { [self] in
            stopAccepting()
            if listenFD >= 0 {
                close(listenFD)
                listenFD = -1
            }
            for connection in Array(connections.values) where connection.isIdle { closeConnection(connection) }
        }
    }

    /// Ends the loop thread (after it has run what was queued, closing every connection) and waits for it.
    func stop() {
        let wasRunning = state.withLock { state -> Bool in
            defer { state.stopping = true }
            return !state.stopping
        }
        guard wasRunning else { return }
        wake()
        exited.wait()
    }

    deinit {
        if listenFD >= 0 { close(listenFD) }
        close(epollFD)
        close(wakeFD)
        readyDescriptors.deallocate()
        readyEvents.deallocate()
    }

    // MARK: The loop

    private func loop() {
        let executor = asUnownedTaskExecutor()
        LoopThread.setCurrent(self)
        while true {
            // Sleep in epoll_wait only with nothing queued; otherwise just poll the descriptors.
            let longest: Int32 = connections.isEmpty && clients.isEmpty ? 1000 : 100
            let wait = state.withLock { state -> Int32 in
                guard state.jobs.isEmpty, state.operations.isEmpty, !state.stopping else { return 0 }
                state.sleeping = true
                return longest
            }
            dispatchReady(waitMilliseconds: wait)
            now = .now
            let (jobs, operations, stopping) = state.withLock { state in
                state.sleeping = false
                defer { state.jobs.removeAll(keepingCapacity: true); state.operations.removeAll() }
                return (state.jobs, state.operations, state.stopping)
            }
            for operation in operations { operation() }
            for job in jobs { job.runSynchronously(on: executor) }
            // What this turn's jobs wrote to clients (Redis commands) goes out now, together; failures queue jobs.
            if !clients.isEmpty {
                for client in clients.values { client.endOfTurn(now: now) }
            }
            if stopping, jobs.isEmpty, operations.isEmpty { break }
            if now >= nextSweep {
                sweep()
                nextSweep = now + Self.sweepInterval
            }
        }
        for connection in Array(connections.values) { closeConnection(connection) }
        for client in clients.values { client.loopStopped() }
        clients = [:]
        storage = [:]
        LoopThread.setCurrent(nil)
        let leftovers = state.withLock { state in
            state.finished = true
            state.operations = []
            defer { state.jobs = [] }
            return state.jobs
        }
        for job in leftovers { globalConcurrentExecutor.enqueue(job) }
        exited.signal()
    }

    /// Waits up to `waitMilliseconds` on the epoll set and serves what is ready: new connections, connections'
    /// bytes, clients' descriptors, the wake-up eventfd.
    private func dispatchReady(waitMilliseconds: Int32) {
        let count = herald_epoll_wait(epollFD, readyDescriptors, readyEvents, Self.readyCapacity, waitMilliseconds)
        guard count > 0 else { return }
        now = .now
        for index in 0..<Int(count) {
            let descriptor = readyDescriptors[index]
            let events = DescriptorEvents(rawValue: readyEvents[index])
            // A descriptor closed earlier in this batch is no longer in the tables.
            if let connection = connections[descriptor] {
                connectionReady(connection, events: events)
            } else if let client = watched[descriptor] {
                client.descriptorReady(descriptor, events: events)
            } else if descriptor == wakeFD {
                var counter: UInt64 = 0
                _ = read(wakeFD, &counter, 8)
            } else if descriptor == listenFD {
                acceptOne()
            }
        }
    }

    // MARK: Accepting

    /// One connection per readiness report: the listener stays ready while more wait, and accepting one at a
    /// time lets the other loops take their share.
    private func acceptOne() {
        let (fd, address) = withUnsafeTemporaryAllocation(of: CChar.self, capacity: 64) { text -> (Int32, String?) in
            let fd = herald_http_accept(listenFD, text.baseAddress!, text.count)
            return (fd, fd >= 0 && text[0] != 0 ? String(cString: text.baseAddress!) : nil)
        }
        guard fd >= 0 else {
            if errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS {
                // Out of descriptors: stop asking for a moment rather than spin on a listener that stays ready.
                engine.logger.warning("accept failed", ["error": String(cString: strerror(errno))])
                stopAccepting()
                acceptPausedUntil = now + .milliseconds(100)
            }
            return
        }
        var counted = false
        if addresses.limit > 0, let address {
            guard addresses.admit(address) else {
                close(fd)
                engine.logger.debug("connection over the per-address limit closed", ["http.client": address])
                return
            }
            counted = true
        }
        guard herald_epoll_add_connection(epollFD, fd) == 0 else {
            if counted, let address { addresses.release(address) }
            close(fd)
            return
        }
        let connection = HTTPConnection(fd: fd, address: address, countedAddress: counted, now: now,
                                        readDeadline: now + readTimeout)
        connections[fd] = connection
        if connections.count >= connectionLimit { stopAccepting() }
    }

    private func stopAccepting() {
        guard accepting else { return }
        _ = herald_epoll_unwatch(epollFD, listenFD)
        accepting = false
    }

    /// Back to accepting after a pause or once under the connection limit (never after the drain closed it).
    func resumeAccepting() {
        guard !accepting, listenFD >= 0, connections.count < connectionLimit else { return }
        if let until = acceptPausedUntil {
            guard now >= until else { return }
            acceptPausedUntil = nil
        }
        accepting = herald_epoll_add_listener(epollFD, listenFD) == 0
    }

    /// Every 100 ms: closes connections past their read deadline or idle timeout, and those done lingering.
    private func sweep() {
        var late = 0
        for connection in Array(connections.values) where connection.isOverdue(now: now, idleTimeout: idleTimeout) {
            closeConnection(connection)
            late += 1
        }
        if late > 0 {
            engine.logger.debug("connections past the read or idle timeout closed", ["http.count": "\(late)"])
        }
        resumeAccepting()
    }

    private func wake() {
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)
    }
}
