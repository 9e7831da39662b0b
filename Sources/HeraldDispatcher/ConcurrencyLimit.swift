import HeraldRuntime

/// An async counting semaphore: at most `limit` slots held at once.
///
/// Waiters line up in two lanes, each in arrival order. The prompt lane (jobs of one send: a device, a small
/// channel or post) is served before the bulk lane (a big fan-out's batches), so a fan-out that keeps the whole
/// window asked for never makes a small job wait behind it: the small job takes the next slots answers free.
/// A waiter may ask for several slots at once and gets them all together, so a sender that refills in groups
/// keeps sending groups. `acquire` fails with `CancellationError` when the waiting task is cancelled, so a
/// shutdown never hangs on a full limit.
final class ConcurrencyLimit: Sendable {
    enum Lane: Int, Sendable {
        case prompt = 0
        case bulk = 1
    }

    private struct Waiter {
        let id: UInt64
        let count: Int
        let continuation: CheckedContinuation<Void, any Error>
    }

    /// One lane's waiters in arrival order; those before `head` are served already.
    private struct Line {
        var waiters: [Waiter] = []
        var head = 0

        var isEmpty: Bool { head == waiters.count }

        mutating func popFirst() -> Waiter {
            let waiter = waiters[head]
            head += 1
            if head == waiters.count {
                waiters.removeAll(keepingCapacity: true)
                head = 0
            } else if head > 1024, head * 2 > waiters.count {
                waiters.removeFirst(head)
                head = 0
            }
            return waiter
        }

        mutating func remove(id: UInt64) -> Waiter? {
            guard let index = waiters[head...].firstIndex(where: { $0.id == id }) else { return nil }
            return waiters.remove(at: index)
        }
    }

    private struct State {
        var available: Int
        var lines = [Line(), Line()]
        var nextID: UInt64 = 0

        /// Nobody waits in `lane` or in a lane served before it.
        func mayTake(_ count: Int, in lane: Lane) -> Bool {
            available >= count && lines[...lane.rawValue].allSatisfy(\.isEmpty)
        }

        /// Hands free slots to the waiters at the head of the lines that they now cover, prompt lane first; a
        /// prompt waiter the free slots do not cover yet holds the bulk lane back too.
        mutating func serve() -> [CheckedContinuation<Void, any Error>] {
            var ready: [CheckedContinuation<Void, any Error>] = []
            for lane in lines.indices {
                while !lines[lane].isEmpty, lines[lane].waiters[lines[lane].head].count <= available {
                    let waiter = lines[lane].popFirst()
                    available -= waiter.count
                    ready.append(waiter.continuation)
                }
                if !lines[lane].isEmpty { break }
            }
            return ready
        }
    }

    let limit: Int
    private let state: Lock<State>

    init(limit: Int) {
        self.limit = max(1, limit)
        state = Lock(State(available: self.limit))
    }

    /// Slots taken now.
    var held: Int { state.withLock { limit - $0.available } }

    /// Takes a slot if one is free and nobody is waiting for one in `lane` or before it; never suspends.
    func tryAcquire(in lane: Lane = .prompt) -> Bool {
        state.withLock { s -> Bool in
            guard s.mayTake(1, in: lane) else { return false }
            s.available -= 1
            return true
        }
    }

    /// Waits for `count` slots (at most `limit`) and takes them together.
    func acquire(_ count: Int = 1, in lane: Lane = .prompt) async throws {
        let count = min(max(1, count), limit)
        let id = state.withLock { s -> UInt64? in
            if s.mayTake(count, in: lane) {
                s.available -= count
                return nil
            }
            s.nextID += 1
            return s.nextID
        }
        guard let id else { return }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let resumeNow: Bool? = state.withLock { s in
                    if Task.isCancelled { return false }
                    if s.mayTake(count, in: lane) {
                        s.available -= count
                        return true
                    }
                    s.lines[lane.rawValue].waiters.append(Waiter(id: id, count: count, continuation: continuation))
                    return nil
                }
                switch resumeNow {
                case true?: continuation.resume()
                case false?: continuation.resume(throwing: CancellationError())
                case nil: break
                }
            }
        } onCancel: {
            let (cancelled, ready) = state.withLock { s -> (CheckedContinuation<Void, any Error>?, [CheckedContinuation<Void, any Error>]) in
                guard let waiter = s.lines[lane.rawValue].remove(id: id) else { return (nil, []) }
                // A large request leaving the head may let smaller ones behind it through.
                return (waiter.continuation, s.serve())
            }
            cancelled?.resume(throwing: CancellationError())
            for continuation in ready { continuation.resume() }
        }
    }

    /// Returns `count` slots at once.
    func release(count: Int = 1) {
        guard count > 0 else { return }
        let ready = state.withLock { s in
            s.available += count
            return s.serve()
        }
        for continuation in ready { continuation.resume() }
    }
}
