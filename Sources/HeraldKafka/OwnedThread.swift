import Foundation
import HeraldRuntime

/// A thread this library owns, for librdkafka calls that block (polls, flushes, commits, metadata, admin).
///
/// Async methods hand their blocking work to it with `run`, so nothing blocks Swift's cooperative pool. Jobs run
/// one at a time in submission order. With an `idle` function (the producer's `rd_kafka_poll`), the thread calls
/// it whenever no job is queued; `wake` must make a running `idle` return early.
final class OwnedThread: @unchecked Sendable { // jobs/stopRequested/exited are guarded by `condition`
    private let condition = NSCondition()
    private var jobs: [@Sendable () -> Void] = []
    private var stopRequested = false
    private var exited = false
    private let idle: (@Sendable () -> Void)?
    private let wake: (@Sendable () -> Void)?
    // Weak: the running thread keeps itself alive; its block holds `self` until the loop ends.
    private weak var thread: Thread?

    init(name: String, idle: (@Sendable () -> Void)? = nil, wake: (@Sendable () -> Void)? = nil) {
        self.idle = idle
        self.wake = wake
        let thread = Thread.named(name) { [self] in loop() }
        self.thread = thread
        thread.start()
    }

    /// Runs `body` on the owned thread and returns its result; fails with `.destroyed` once the thread stopped.
    func run<T: Sendable>(_ body: @escaping @Sendable () throws(KafkaError) -> T) async throws(KafkaError) -> T {
        let result: Result<T, KafkaError> = await withCheckedContinuation { continuation in
            let accepted = submit {
                continuation.resume(returning: Result { () throws(KafkaError) -> T in try body() })
            }
            if !accepted { continuation.resume(returning: .failure(.closed("client"))) }
        }
        return try result.get()
    }

    /// Queues `job`; false when the thread has been asked to stop.
    func submit(_ job: @escaping @Sendable () -> Void) -> Bool {
        condition.lock()
        guard !stopRequested else {
            condition.unlock()
            return false
        }
        jobs.append(job)
        condition.signal()
        // Under the lock: once `stop` has returned the owner may destroy what `wake` touches (rd_kafka_yield on a
        // handle); it cannot return before this call does.
        wake?()
        condition.unlock()
        return true
    }

    /// Whether the caller runs on this thread.
    var isCurrent: Bool { Thread.current === thread }

    /// Runs the jobs already queued, then ends the thread and waits for it (unless called on the thread itself).
    /// Stopping again (a `deinit` after `close`) does not wake: what `wake` touches may be destroyed by then.
    func stop() {
        condition.lock()
        let first = !stopRequested
        stopRequested = true
        condition.broadcast()
        if first { wake?() }
        condition.unlock()
        guard !isCurrent else { return }
        condition.lock()
        while !exited { condition.wait() }
        condition.unlock()
    }

    private func loop() {
        while true {
            condition.lock()
            while jobs.isEmpty && !stopRequested && idle == nil { condition.wait() }
            let batch = jobs
            jobs.removeAll()
            let finished = batch.isEmpty && stopRequested
            condition.unlock()
            if finished { break }
            if batch.isEmpty {
                idle?()
            } else {
                for job in batch { job() }
            }
        }
        condition.lock()
        exited = true
        condition.broadcast()
        condition.unlock()
    }
}
