import Dispatch
import HeraldRuntime

/// One call waiting for its replies: encoded commands, how many replies they produce, and when the caller gives up.
struct RedisRequest: Sendable {
    /// The waiting caller: one reply (`command`), all of them (`pipeline`), or one node's share of a pipeline
    /// sent to several nodes at once.
    enum Completion: Sendable {
        case single(CheckedContinuation<RedisValue, any Error>)
        case many(CheckedContinuation<[RedisValue], any Error>)
        case part(RedisGather, Int)

        func succeed(_ replies: [RedisValue]) {
            switch self {
            case .single(let continuation): continuation.resume(returning: replies[0])
            case .many(let continuation): continuation.resume(returning: replies)
            case .part(let gather, let index): gather.finish(index, .success(replies))
            }
        }

        /// Answers with one reply: the value itself, or a one-element array for a pipeline of one command.
        func succeed(single value: RedisValue) {
            switch self {
            case .single(let continuation): continuation.resume(returning: value)
            case .many(let continuation): continuation.resume(returning: [value])
            case .part(let gather, let index): gather.finish(index, .success([value]))
            }
        }

        func fail(_ error: RedisError) {
            switch self {
            case .single(let continuation): continuation.resume(throwing: error)
            case .many(let continuation): continuation.resume(throwing: error)
            case .part(let gather, let index): gather.finish(index, .failure(error))
            }
        }
    }

    var payload: [UInt8]
    var replyCount: Int
    var deadline: ContinuousClock.Instant
    var completion: Completion

    func succeed(_ replies: [RedisValue]) { completion.succeed(replies) }

    func fail(_ error: RedisError) { completion.fail(error) }
}

/// One caller waiting for the replies of several nodes, sent at once: resumed with every node's replies in order
/// once all have answered, or with the first error, as `PartFailed` (the other answers are then dropped as they
/// come).
final class RedisGather: Sendable {
    /// The call to the node of `part` failed with `error`.
    struct PartFailed: Error {
        var part: Int
        var error: RedisError
    }

    private struct State {
        var continuation: CheckedContinuation<[[RedisValue]], any Error>?
        var replies: [[RedisValue]]
        var left: Int
    }
    private let state: Lock<State>

    init(parts: Int, continuation: CheckedContinuation<[[RedisValue]], any Error>) {
        state = Lock(State(continuation: continuation, replies: Array(repeating: [], count: parts), left: parts))
    }

    func finish(_ index: Int, _ result: Result<[RedisValue], RedisError>) {
        let resume = state.withLock { state -> (CheckedContinuation<[[RedisValue]], any Error>, Result<[[RedisValue]], PartFailed>)? in
            guard let continuation = state.continuation else { return nil }
            switch result {
            case .failure(let error):
                state.continuation = nil
                return (continuation, .failure(PartFailed(part: index, error: error)))
            case .success(let replies):
                state.replies[index] = replies
                state.left -= 1
                guard state.left == 0 else { return nil }
                state.continuation = nil
                return (continuation, .success(state.replies))
            }
        }
        guard let (continuation, outcome) = resume else { return }
        continuation.resume(with: outcome.mapError { $0 as any Error })
    }
}

/// The queue shared by a client's connection threads.
///
/// Callers add requests from any task; an idle worker thread takes everything queued (up to `maxBatchCommands`),
/// so under concurrency many calls share one write and one read loop: automatic pipelining. The queue is bounded
/// by command count; past the bound calls fail at once with `.overloaded` instead of piling up behind a slow Redis.
final class RedisRequestQueue: Sendable {
    /// Commands one worker sends before it reads replies; bounds the memory of one batch and lets other
    /// connections share a burst.
    static let maxBatchCommands = 1_024

    private struct State {
        var requests: [RedisRequest] = []
        var queuedCommands = 0
        var idleWorkers: [Int] = []
        var isClosed = false
        var runningWorkers: Int
        var stopWaiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state: Lock<State>
    /// One semaphore per worker: signalled once each time that worker is taken off `idleWorkers`.
    private let wakeups: [DispatchSemaphore]
    private let maxQueuedCommands: Int

    init(workerCount: Int, maxQueuedCommands: Int) {
        state = Lock(State(runningWorkers: workerCount))
        wakeups = (0..<workerCount).map { _ in DispatchSemaphore(value: 0) }
        self.maxQueuedCommands = maxQueuedCommands
    }

    /// Queues a request, or returns why it cannot be queued (the caller then fails it).
    func enqueue(_ request: RedisRequest) -> RedisError? {
        let outcome: Result<Int?, RedisError> = state.withLock { state in
            if state.isClosed { return .failure(RedisError(.closed, "the Redis client is closed")) }
            // A single request larger than the bound is still accepted on an empty queue, so big pipelines work.
            if state.queuedCommands > 0, state.queuedCommands + request.replyCount > maxQueuedCommands {
                return .failure(RedisError(.overloaded, "more than \(maxQueuedCommands) Redis commands queued"))
            }
            state.requests.append(request)
            state.queuedCommands += request.replyCount
            // Only the first request into an empty queue wakes a worker: that worker takes everything queued by
            // the time it runs, so waking one per request would mostly wake threads that find nothing to do.
            return .success(state.requests.count == 1 ? state.idleWorkers.popLast() : nil)
        }
        switch outcome {
        case .failure(let error): return error
        case .success(let worker):
            if let worker { wakeups[worker].signal() }
            return nil
        }
    }

    /// Blocks worker `index` until there is work, then returns a batch; `nil` once closed and drained.
    func nextBatch(worker index: Int) -> [RedisRequest]? {
        while true {
            enum Step { case batch([RedisRequest], wake: Int?), wait, stop([CheckedContinuation<Void, Never>]) }
            let step: Step = state.withLock { state in
                if !state.requests.isEmpty {
                    var taken = 0
                    var commands = 0
                    while taken < state.requests.count,
                          taken == 0 || commands + state.requests[taken].replyCount <= Self.maxBatchCommands {
                        commands += state.requests[taken].replyCount
                        taken += 1
                    }
                    state.queuedCommands -= commands
                    if taken == state.requests.count {
                        var batch: [RedisRequest] = []
                        swap(&batch, &state.requests)
                        return .batch(batch, wake: nil)
                    }
                    let batch = Array(state.requests[..<taken])
                    state.requests.removeFirst(taken)
                    // What is left would otherwise wait for this worker: `enqueue` wakes one only into an empty queue.
                    return .batch(batch, wake: state.idleWorkers.popLast())
                }
                if state.isClosed {
                    state.runningWorkers -= 1
                    guard state.runningWorkers == 0 else { return .stop([]) }
                    defer { state.stopWaiters = [] }
                    return .stop(state.stopWaiters)
                }
                state.idleWorkers.append(index)
                return .wait
            }
            switch step {
            case .batch(let batch, let wake):
                if let wake { wakeups[wake].signal() }
                return batch
            case .wait: wakeups[index].wait()
            case .stop(let waiters):
                for waiter in waiters { waiter.resume() }
                return nil
            }
        }
    }

    /// Refuses new requests and wakes every idle worker; workers finish what is queued, then exit.
    func shutdown() {
        let idle: [Int] = state.withLock { state in
            state.isClosed = true
            defer { state.idleWorkers = [] }
            return state.idleWorkers
        }
        for worker in idle { wakeups[worker].signal() }
    }

    /// Returns once every worker has exited.
    func waitUntilStopped() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let stopped = state.withLock { state in
                if state.runningWorkers == 0 { return true }
                state.stopWaiters.append(continuation)
                return false
            }
            if stopped { continuation.resume() }
        }
    }
}
