import Foundation
import HeraldRuntime
internal import CHeraldShims

/// Something with a file descriptor registered on the loop.
protocol EventLoopHandler: AnyObject {
    /// Called on the loop thread with the epoll event bits.
    func handle(events: DescriptorEvents)
}

/// One thread running `epoll_wait`: socket readiness, closures posted from other threads, and a periodic tick.
///
/// Everything registered here is touched only on the loop thread; other threads talk to it through `execute`.
final class EventLoop: @unchecked Sendable {  // @unchecked: `handlers` and the hooks are loop-thread only; the inbox is a Lock.
    private struct Inbox {
        var work: [@Sendable () -> Void] = []
        /// Requests get their own lane: no closure allocation per push.
        var requests: [PendingRequest] = []
        var wakeupPending = false
        var stopped = false
    }

    private let epollFD: Int32
    private let wakeFD: Int32
    private let inbox = Lock(Inbox())
    private var handlers: [Int32: any EventLoopHandler] = [:]
    private let tickInterval: Duration
    private var lastTick = ContinuousClock.now
    private var running = true
    private let finished = Lock<(done: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    /// Runs after every batch of events and posted closures (flush writes once per batch, not per request).
    var afterBatch: () -> Void = {}
    /// Receives requests posted with `submit`, in order, on the loop thread.
    var onRequest: (PendingRequest) -> Void = { _ in }
    /// Runs about every `tickInterval` (timeouts, PINGs, reconnects).
    var onTick: (ContinuousClock.Instant) -> Void = { _ in }

    init(name: String, tickInterval: Duration) throws(APNsError) {
        epollFD = herald_epoll_create()
        wakeFD = herald_eventfd_create()
        self.tickInterval = tickInterval
        guard epollFD >= 0, wakeFD >= 0 else {
            throw APNsError(.invalidConfiguration, "cannot create epoll/eventfd: errno \(errno)")
        }
        _ = herald_epoll_add_readable(epollFD, wakeFD)
        let thread = Thread.named(name) { [self] in run() }
        thread.start()
    }

    deinit {
        close(epollFD)
        close(wakeFD)
    }

    /// Posts `work` to the loop thread. Returns false (and drops it) once the loop has stopped.
    @discardableResult
    func execute(_ work: @escaping @Sendable () -> Void) -> Bool {
        enqueue { $0.work.append(work) }
    }

    /// Posts a request to `onRequest`. Returns false (and drops it) once the loop has stopped.
    func submit(_ request: PendingRequest) -> Bool {
        post { $0.append(request) }
    }

    /// Posts a batch of requests to `onRequest` under one lock and at most one wake-up. Returns false (and drops
    /// them all) once the loop has stopped.
    func submit(_ requests: [PendingRequest]) -> Bool {
        post { $0.append(contentsOf: requests) }
    }

    private func post(_ add: (inout [PendingRequest]) -> Void) -> Bool {
        enqueue { add(&$0.requests) }
    }

    /// Adds to the inbox under its lock and wakes the loop unless a wake-up is already pending. False once the
    /// loop has stopped (nothing is added then).
    private func enqueue(_ add: (inout Inbox) -> Void) -> Bool {
        let wake: Bool? = inbox.withLock { box in
            if box.stopped { return nil }
            add(&box)
            if box.wakeupPending { return false }
            box.wakeupPending = true
            return true
        }
        guard let wake else { return false }
        if wake {
            var one: UInt64 = 1
            _ = write(wakeFD, &one, 8)
        }
        return true
    }

    /// Stops the loop after the current batch; closures posted before this still run. Loop thread only.
    func stop() { running = false }

    /// Waits until the loop thread has exited.
    func waitUntilFinished() async {
        await withCheckedContinuation { continuation in
            let resumeNow = finished.withLock { state in
                if state.done { return true }
                state.waiters.append(continuation)
                return false
            }
            if resumeNow { continuation.resume() }
        }
    }

    func register(_ fd: Int32, _ handler: any EventLoopHandler, for interest: DescriptorEvents) {
        handlers[fd] = handler
        _ = herald_epoll_watch(epollFD, fd, interest.rawValue, 1)
    }

    func modify(_ fd: Int32, for interest: DescriptorEvents) {
        _ = herald_epoll_watch(epollFD, fd, interest.rawValue, 0)
    }

    func unregister(_ fd: Int32) {
        handlers[fd] = nil
        _ = herald_epoll_unwatch(epollFD, fd)
    }

    private func run() {
        var fds = [Int32](repeating: -1, count: 64)
        var events = [UInt32](repeating: 0, count: 64)
        let timeoutMilliseconds = Int32(clamping: max(1, tickInterval.inMilliseconds))
        while running {
            let count = herald_epoll_wait(epollFD, &fds, &events, Int32(fds.count), timeoutMilliseconds)
            if count > 0 {
                for index in 0..<Int(count) {
                    let fd = fds[index]
                    if fd == wakeFD {
                        var value: UInt64 = 0
                        _ = read(wakeFD, &value, 8)
                    } else if let handler = handlers[fd] {
                        handler.handle(events: DescriptorEvents(rawValue: events[index]))
                    }
                }
            }
            drainInbox()
            let now = ContinuousClock.now
            if now - lastTick >= tickInterval {
                lastTick = now
                onTick(now)
            }
            afterBatch()
        }
        // Anything posted after stop() was decided is refused by `execute`; run what got in before.
        inbox.withLock { $0.stopped = true }
        drainInbox()
        afterBatch()
        handlers.removeAll()
        afterBatch = {}
        onRequest = { _ in }
        onTick = { _ in }
        let waiters = finished.withLock { state in
            state.done = true
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    private func drainInbox() {
        var requests: [PendingRequest] = []
        while true {
            let work = inbox.withLock { box in
                box.wakeupPending = false
                swap(&requests, &box.requests)
                return box.work.isEmpty ? [] : box.work.swapAndClear()
            }
            if work.isEmpty, requests.isEmpty { return }
            // Closures first: they may be cancellations of requests posted just before them.
            for item in work { item() }
            for request in requests { onRequest(request) }
            // Hand the emptied buffer back so its capacity is reused by the next batch.
            requests.removeAll(keepingCapacity: true)
        }
    }
}

extension Array {
    /// Returns the elements and leaves the array empty, keeping neither (so the old buffer is freed).
    fileprivate mutating func swapAndClear() -> [Element] {
        var taken: [Element] = []
        swap(&taken, &self)
        return taken
    }
}
