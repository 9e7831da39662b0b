import Dispatch
import Foundation

/// A long-running part of a process (a server, a consumer loop). `run()` returns when the task running it is
/// cancelled, after finishing or handing back in-flight work.
public protocol Service: Sendable {
    func run() async throws
}

/// Runs services together and stops them on one of `signals`, when its own task is cancelled, or when one of
/// them ends: the last one started is cancelled first and given until `gracePeriod` (shared by all) to return
/// before the next is cancelled; one still running then is logged, and `run()` returns once every one has ended.
/// Modelled on swift-service-lifecycle's ServiceGroup. A group is a Service itself (one service made of parts).
public struct ServiceGroup: Service {
    public var services: [any Service]
    public var signals: [Int32]
    public var gracePeriod: Duration
    public var logger: Logger

    public init(services: [any Service], signals: [Int32] = [SIGTERM, SIGINT], gracePeriod: Duration = .seconds(25),
                logger: Logger) {
        self.services = services
        self.signals = signals
        self.gracePeriod = gracePeriod
        self.logger = logger
    }

    /// Runs until a signal arrives, the task is cancelled or a service ends; rethrows the first failure.
    public func run() async throws {
        let signals = SignalWaiter(signals: self.signals)
        let count = services.count
        let result: (any Error)? = await withTaskGroup(of: (Int, (any Error)?).self) { group in
            // One child task per service, each in its own task so it can be cancelled on its own.
            let handles = Lock<[Int: Task<Void, any Error>]>([:])
            for (index, service) in services.enumerated() {
                let task = Task { try await service.run() }
                handles.withLock { $0[index] = task }
                group.addTask {
                    do { try await task.value; return (index, nil) } catch { return (index, error) }
                }
            }
            group.addTask {
                let signal = await signals.next()
                return (-1, signal.map { SignalReceived(signal: $0) })
            }
            group.addTask {
                await waitForCancellation()
                return (-1, nil)
            }
            var firstError: (any Error)?
            var finished = 0
            while let (index, error) = await group.next() {
                if index == -1 {
                    if let error { logger.info("stopping", ["signal": "\((error as! SignalReceived).signal)"]) }
                } else {
                    finished += 1
                    if let error, !(error is CancellationError), firstError == nil {
                        firstError = error
                        logger.error("service failed", ["error": "\(error)"])
                    }
                    if finished == count { break }
                }
                // A signal, or one service ended: stop the rest, newest first, within the grace period.
                let deadline = ContinuousClock.now + gracePeriod
                for i in (0..<count).reversed() {
                    guard let task = handles.withLock({ $0[i] }) else { continue }
                    task.cancel()
                    let stopped = await Self.ends(task, by: deadline)
                    if !stopped { logger.warning("service did not stop within the grace period", ["service.index": "\(i)"]) }
                }
                signals.cancel()
                group.cancelAll()
                break
            }
            return firstError
        }
        signals.cancel()
        if let result { throw result }
    }

    /// Whether `task` ended by `deadline`. The timer and the watcher are unstructured tasks, so neither inherits
    /// this task's cancellation: a group inside another is stopped by cancelling it, and a sleep in a cancelled
    /// task ends at once, which gave its services no time and logged every one of them as late.
    private static func ends(_ task: Task<Void, any Error>, by deadline: ContinuousClock.Instant) async -> Bool {
        await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            let pending = Lock<CheckedContinuation<Bool, Never>?>(continuation)
            let answer: @Sendable (Bool) -> Void = { ended in
                pending.withLock { waiting in
                    waiting?.resume(returning: ended)
                    waiting = nil
                }
            }
            let timer = Task {
                try? await Task.sleep(until: deadline, clock: .continuous)
                answer(false)
            }
            Task {
                _ = try? await task.value
                answer(true)
                timer.cancel()
            }
        }
    }
}

struct SignalReceived: Error { let signal: Int32 }

/// Returns once the calling task is cancelled.
public func waitForCancellation() async {
    while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
}

/// Turns POSIX signals into an async wait. The default action of each signal is ignored while it is watched.
// @unchecked: `sources` is set once in init and dispatch sources are thread-safe; the rest is in a Lock.
public final class SignalWaiter: @unchecked Sendable {
    private let sources: [any DispatchSourceSignal]
    private let state = Lock<(received: Int32?, waiters: [CheckedContinuation<Int32?, Never>], cancelled: Bool)>(
        (nil, [], false))

    public init(signals: [Int32]) {
        let queue = DispatchQueue(label: "herald.signals")
        var sources: [any DispatchSourceSignal] = []
        for signalNumber in signals {
            Foundation.signal(signalNumber, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: queue)
            sources.append(source)
        }
        self.sources = sources
        for source in sources {
            let number = Int32(source.handle)
            source.setEventHandler { [weak self] in self?.deliver(number) }
            source.resume()
        }
    }

    /// The next signal, or nil once cancelled. Signals repeat (SIGHUP): each call waits for a new one.
    public func next() async -> Int32? {
        await withCheckedContinuation { continuation in
            let ready: Int32?? = state.withLock { s in
                if s.cancelled { return .some(nil) }
                if let received = s.received { s.received = nil; return .some(received) }
                s.waiters.append(continuation)
                return .none
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }

    public func cancel() {
        let waiters = state.withLock { s in
            s.cancelled = true
            defer { s.waiters = [] }
            return s.waiters
        }
        for waiter in waiters { waiter.resume(returning: nil) }
        for source in sources { source.cancel() }
    }

    private func deliver(_ signal: Int32) {
        let waiter = state.withLock { s -> CheckedContinuation<Int32?, Never>? in
            if s.waiters.isEmpty { s.received = signal; return nil }
            return s.waiters.removeFirst()
        }
        waiter?.resume(returning: signal)
    }
}
