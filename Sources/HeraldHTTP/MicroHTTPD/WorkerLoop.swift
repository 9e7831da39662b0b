internal import CHeraldShims
internal import CMicroHTTPD
import Foundation
import HeraldRuntime

/// One thread driving one libmicrohttpd daemon (external epoll mode), which is also the preferred task executor
/// of the handler tasks that daemon starts.
///
/// Why: with libmicrohttpd's own threads, every request hopped to Swift's pool for its handler and back through
/// the daemon's wake-up pipe, two thread switches per request on a 2-core box. Here a handler that does not wait
/// on another thread runs start to finish on the thread that read its request, and its response is sent in the
/// same loop turn. A handler that awaits Kafka is resumed here by an `enqueue` that wakes the loop; one that awaits
/// Redis never leaves the thread: as a `ThreadEventLoop` the loop also drives the Redis client's connection of this
/// loop, whose socket sits in the same epoll set. Handlers must not block: a blocked handler stalls every
/// connection of its loop.
// @unchecked: `daemon` (set once, at the end of init), `options` and the descriptors are released in deinit; the queue is a
// Lock; the daemon is driven only from the loop thread, except MHD_resume_connection (thread-safe) and the final
// MHD_stop_daemon after the thread has exited; `connections`, `clients`, `watched` and `storage` are only touched by
// libmicrohttpd's callbacks, the sweep and `ThreadEventLoop` calls, all on the loop thread.
final class WorkerLoop: TaskExecutor, ThreadEventLoop, @unchecked Sendable {
    let handler: ConnectionHandler
    private var daemon: OpaquePointer!
    private let options: UnsafeMutablePointer<herald_mhd_options>
    private let epollFD: Int32
    private let wakeFD: Int32
    private let state = Lock(LoopState())
    private let exited = DispatchSemaphore(value: 0)
    private let name: String
    private let addresses: AddressCounter
    private static let sweepInterval: Duration = .milliseconds(100)
    private let readTimeout: Duration
    /// Every open connection of this daemon.
    private var connections: [OpaquePointer: OpenConnection] = [:]
    private var nextSweep = ContinuousClock.now
    /// `ThreadEventLoop` clients (told at the end of each turn and when the loop stops), by identity.
    private var clients: [ObjectIdentifier: any LoopClient] = [:]
    /// Descriptors other than libmicrohttpd's that this loop's epoll set watches, and who is told of them.
    private var watched: [Int32: any LoopClient] = [:]
    private var storage: [ObjectIdentifier: AnyObject] = [:]
    /// What one epoll_wait reports (descriptors and their readiness bits), kept for the life of the loop.
    private static let readyCapacity: Int32 = 16
    private let readyDescriptors = UnsafeMutablePointer<Int32>.allocate(capacity: Int(readyCapacity))
    private let readyEvents = UnsafeMutablePointer<UInt32>.allocate(capacity: Int(readyCapacity))

    /// What the read deadline and the per-address limit need to know of a connection.
    private struct OpenConnection {
        let socket: Int32
        /// The client address when it counts against the per-address limit (released on close).
        let countedAddress: String?
        /// While a request is being awaited or read: when it must be in. Nil while it is being answered.
        var readDeadline: ContinuousClock.Instant?
    }

    private struct LoopState {
        var jobs: [UnownedJob] = []
        var operations: [@Sendable () -> Void] = []
        /// The loop is in (or about to enter) epoll_wait; whoever queues work must wake it.
        var sleeping = false
        var stopping = false
        /// The thread has exited; jobs go to the global executor from now on.
        var finished = false
    }

    /// Starts a daemon on `descriptor` (which it then owns) and the thread that drives it.
    init(listening descriptor: Int32, configuration: HTTPServerConfiguration, connectionLimit: Int,
         addresses: AddressCounter, handler: ConnectionHandler, name: String) throws(HTTPServerError) {
        self.handler = handler
        self.name = name
        self.addresses = addresses
        readTimeout = configuration.requestReadTimeout
        let timeout = configuration.connectionTimeout.components
        let timeoutSeconds = timeout.seconds + (timeout.attoseconds > 0 ? 1 : 0)
        let epollFD = herald_epoll_create()
        let wakeFD = herald_eventfd_create()
        guard epollFD >= 0, wakeFD >= 0, herald_epoll_add_readable(epollFD, wakeFD) == 0 else {
            let reason = String(cString: strerror(errno))
            [epollFD, wakeFD, descriptor].filter { $0 >= 0 }.forEach { close($0) }
            throw HTTPServerError(.startFailed, "epoll/eventfd: \(reason)")
        }
        self.epollFD = epollFD
        self.wakeFD = wakeFD

        // The callbacks find this loop through an unretained pointer: the loop stops its daemon (after which no
        // callback runs) before it can be freed.
        options = .allocate(capacity: 1)
        let context = Unmanaged.passUnretained(self).toOpaque()
        options.initialize(to: herald_mhd_options(
            flags: MHD_USE_EPOLL.rawValue | MHD_ALLOW_SUSPEND_RESUME.rawValue,
            listen_fd: descriptor,
            connection_timeout_seconds: UInt32(clamping: timeoutSeconds),
            connection_limit: UInt32(clamping: connectionLimit),
            access_handler: { cls, connection, url, method, _, uploadData, uploadSize, slot in
                guard let cls, let connection, let url, let method, let uploadSize, let slot else { return .NO }
                let loop = Unmanaged<WorkerLoop>.fromOpaque(cls).takeUnretainedValue()
                // A later call without data means the body is complete (or the handler has answered).
                let bodyComplete = slot.pointee != nil && uploadSize.pointee == 0
                if bodyComplete { loop.connections[connection]?.readDeadline = nil }
                return loop.handler.access(connection, url: url, method: method, uploadData: uploadData,
                                           uploadSize: uploadSize, slot: slot, executor: loop)
            },
            access_handler_cls: context,
            request_completed: { cls, connection, slot, code in
                guard let cls, let slot else { return }
                let loop = Unmanaged<WorkerLoop>.fromOpaque(cls).takeUnretainedValue()
                loop.handler.completed(slot, code: code)
                // Keep-alive: the next request has until the read timeout from now.
                if let connection { loop.connections[connection]?.readDeadline = .now + loop.readTimeout }
            },
            request_completed_cls: context,
            log: { cls, message in
                guard let cls, let message else { return }
                Unmanaged<WorkerLoop>.fromOpaque(cls).takeUnretainedValue().handler.engine.logger
                    .debug("libmicrohttpd: \(String(cString: message))")
            },
            log_cls: context,
            notify_connection: { cls, connection, _, code in
                guard let cls, let connection else { return }
                let loop = Unmanaged<WorkerLoop>.fromOpaque(cls).takeUnretainedValue()
                if code == .CONNECTION_NOTIFY_STARTED {
                    loop.opened(connection)
                } else if let closed = loop.connections.removeValue(forKey: connection),
                          let address = closed.countedAddress {
                    loop.addresses.release(address)
                }
            },
            notify_connection_cls: context))

        // From here on `self` is whole: a failure leaves the descriptors and options to deinit.
        guard let started = herald_mhd_start(options) else {
            close(descriptor)
            throw HTTPServerError(.startFailed, "libmicrohttpd did not start (see debug log)")
        }
        daemon = started
        guard herald_epoll_add_readable(epollFD, herald_mhd_epoll_fd(started)) == 0 else {
            MHD_stop_daemon(started)
            throw HTTPServerError(.startFailed, "cannot watch libmicrohttpd's epoll descriptor")
        }
        let thread = Thread { [self] in loop() }
        thread.name = name
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

    /// Runs `operation` on the loop thread (libmicrohttpd calls that must not race the loop's MHD_run).
    func perform(_ operation: @escaping @Sendable () -> Void) {
        let shouldWake = state.withLock { state -> Bool in
            state.operations.append(operation)
            defer { state.sleeping = false }
            return state.sleeping
        }
        if shouldWake { wake() }
    }

    /// Stops accepting on this daemon; the listening descriptor it hands back is closed.
    func quiesce() {
        perform { [self] in
            let listening = MHD_quiesce_daemon(daemon)
            if listening >= 0 { close(listening) }
        }
    }

    /// Ends the loop thread (after it has run what was queued) and waits for it. The daemon stays up, idle,
    /// until `stopDaemon`.
    func stopLoop() {
        let wasRunning = state.withLock { state -> Bool in
            defer { state.stopping = true }
            return !state.stopping
        }
        guard wasRunning else { return }
        wake()
        exited.wait()
    }

    /// Closes every connection and frees the daemon. Only after `stopLoop`, with nothing left suspended.
    func stopDaemon() {
        MHD_stop_daemon(daemon)
    }

    deinit {
        close(epollFD)
        close(wakeFD)
        options.deinitialize(count: 1)
        options.deallocate()
        readyDescriptors.deallocate()
        readyEvents.deallocate()
    }

    // MARK: The loop

    private func loop() {
        let executor = asUnownedTaskExecutor()
        LoopThread.setCurrent(self)
        var busyTurns = 0
        while true {
            MHD_run(daemon)
            let (jobs, operations, stopping) = state.withLock { state in
                defer { state.jobs.removeAll(keepingCapacity: true); state.operations.removeAll() }
                return (state.jobs, state.operations, state.stopping)
            }
            for operation in operations { operation() }
            for job in jobs { job.runSynchronously(on: executor) }
            // What this turn's jobs wrote to clients (Redis commands) goes out now, together; failures queue jobs.
            let now = ContinuousClock.now
            if !clients.isEmpty {
                for client in clients.values { client.endOfTurn(now: now) }
            }
            // Work just done may have resumed connections: let libmicrohttpd send their responses first.
            if !jobs.isEmpty || !operations.isEmpty {
                // A loop kept busy by other threads' jobs (Kafka acks) still reads its clients' sockets.
                busyTurns += 1
                if busyTurns >= 8, !watched.isEmpty {
                    busyTurns = 0
                    dispatchReady(waitMilliseconds: 0)
                }
                continue
            }
            busyTurns = 0
            if stopping { break }

            // Read deadlines are checked every 100 ms while connections are open.
            if !connections.isEmpty, now >= nextSweep {
                closeLateReaders(now: now)
                nextSweep = now + Self.sweepInterval
            }
            var timeout: UInt64 = 0
            let longest: UInt64 = connections.isEmpty && clients.isEmpty ? 1000 : 100
            let waitMilliseconds = MHD_get_timeout(daemon, &timeout) == .YES ? Int32(min(timeout, longest))
                                                                             : Int32(longest)
            let sleep = state.withLock { state -> Bool in
                guard state.jobs.isEmpty, state.operations.isEmpty, !state.stopping else { return false }
                state.sleeping = true
                return true
            }
            if sleep {
                dispatchReady(waitMilliseconds: waitMilliseconds)
                var counter: UInt64 = 0
                _ = read(wakeFD, &counter, 8)
                state.withLock { $0.sleeping = false }
            }
        }
        for client in clients.values { client.loopStopped() }
        clients = [:]
        storage = [:]
        LoopThread.setCurrent(nil)
        let leftovers = state.withLock { state in
            state.finished = true
            defer { state.jobs = [] }
            return state.jobs
        }
        for job in leftovers { globalConcurrentExecutor.enqueue(job) }
        exited.signal()
    }

    /// Waits up to `waitMilliseconds` on the epoll set and tells clients which of their descriptors are ready.
    /// libmicrohttpd's descriptor and the eventfd need nothing here: the next `MHD_run` and the queue cover them.
    private func dispatchReady(waitMilliseconds: Int32) {
        let count = herald_epoll_wait(epollFD, readyDescriptors, readyEvents, Self.readyCapacity, waitMilliseconds)
        for index in 0..<Int(max(0, count)) {
            // A descriptor closed by an earlier client in this batch is no longer in `watched`.
            let descriptor = readyDescriptors[index]
            watched[descriptor]?.descriptorReady(descriptor, events: DescriptorEvents(rawValue: readyEvents[index]))
        }
    }

    // MARK: Connection limits libmicrohttpd lacks

    /// A new connection: counted against its address's limit (closed at once when over it) and given its first
    /// read deadline.
    private func opened(_ connection: OpaquePointer) {
        let socket = herald_mhd_connection_fd(connection)
        var counted: String?
        if addresses.limit > 0, let address = ConnectionHandler.clientAddress(connection) {
            guard addresses.admit(address) else {
                // libmicrohttpd sees end-of-stream on its next read and closes the connection.
                if socket >= 0 { shutdown(socket, Int32(SHUT_RDWR)) }
                connections[connection] = OpenConnection(socket: socket, countedAddress: nil, readDeadline: nil)
                handler.engine.logger.debug("connection over the per-address limit closed", ["http.client": address])
                return
            }
            counted = address
        }
        connections[connection] = OpenConnection(socket: socket, countedAddress: counted,
                                                 readDeadline: .now + readTimeout)
    }

    /// Closes the connections whose request is not in by its deadline. Shutting the socket down makes
    /// libmicrohttpd see end-of-stream and close the connection through its usual path (callbacks included).
    private func closeLateReaders(now: ContinuousClock.Instant) {
        var closed = 0
        for (connection, open) in connections {
            guard let deadline = open.readDeadline, deadline <= now else { continue }
            connections[connection]?.readDeadline = nil
            if open.socket >= 0 { shutdown(open.socket, Int32(SHUT_RDWR)) }
            closed += 1
        }
        if closed > 0 {
            handler.engine.logger.debug("connections past the request read timeout closed", ["http.count": "\(closed)"])
        }
    }

    private func wake() {
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)
    }
}
