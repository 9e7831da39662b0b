import HeraldRuntime

/// An async counting semaphore: at most `limit` slots held at once, waiters served in arrival order.
///
/// A waiter may ask for several slots at once and gets them all together, so a sender that refills in groups
/// keeps sending groups. `acquire` fails with `CancellationError` when the waiting task is cancelled, so a
/// shutdown never hangs on a full limit.
final class ConcurrencyLimit: Sendable {
    private struct Waiter {
        let id: UInt64
        let count: Int
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var available: Int
        var waiters: [Waiter] = []
        var head = 0
        var nextID: UInt64 = 0

        var nobodyWaits: Bool { head == waiters.count }

        /// Hands free slots to the waiters at the head of the line that they now cover.
        mutating func serve() -> [CheckedContinuation<Void, any Error>] {
            var ready: [CheckedContinuation<Void, any Error>] = []
            while head < waiters.count, waiters[head].count <= available {
                available -= waiters[head].count
                ready.append(waiters[head].continuation)
                head += 1
            }
            if head == waiters.count {
                waiters.removeAll(keepingCapacity: true)
                head = 0
            } else if head > 1024, head * 2 > waiters.count {
                waiters.removeFirst(head)
                head = 0
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

    /// Takes a slot if one is free and nobody is waiting for one; never suspends.
    func tryAcquire() -> Bool {
        state.withLock { s -> Bool in
            guard s.available > 0, s.nobodyWaits else { return false }
            s.available -= 1
            return true
        }
    }

    /// Waits for `count` slots (at most `limit`) and takes them together.
    func acquire(_ count: Int = 1) async throws {
        let count = min(max(1, count), limit)
        let id = state.withLock { s -> UInt64? in
            if s.available >= count, s.nobodyWaits {
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
                    if s.available >= count, s.nobodyWaits {
                        s.available -= count
                        return true
                    }
                    s.waiters.append(Waiter(id: id, count: count, continuation: continuation))
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
                guard let index = s.waiters[s.head...].firstIndex(where: { $0.id == id }) else { return (nil, []) }
                let waiter = s.waiters.remove(at: index)
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
