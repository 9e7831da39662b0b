import HeraldRuntime

/// An async counting semaphore: at most `limit` holders at once, waiters served in arrival order.
///
/// `acquire()` fails with `CancellationError` when the waiting task is cancelled, so a shutdown never hangs on
/// a full limit.
final class ConcurrencyLimit: Sendable {
    private struct Waiter {
        let id: UInt64
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var available: Int
        var waiters: [Waiter] = []
        var head = 0
        var nextID: UInt64 = 0
    }

    private let state: Lock<State>

    init(limit: Int) { state = Lock(State(available: max(1, limit))) }

    /// Takes a slot if one is free and nobody is waiting for one; never suspends.
    func tryAcquire() -> Bool {
        state.withLock { s -> Bool in
            guard s.available > 0, s.head == s.waiters.count else { return false }
            s.available -= 1
            return true
        }
    }

    func acquire() async throws {
        if tryAcquire() { return }
        let id = state.withLock { s -> UInt64 in
            s.nextID += 1
            return s.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let resumeNow: Bool? = state.withLock { s in
                    if Task.isCancelled { return false }
                    if s.available > 0, s.head == s.waiters.count {
                        s.available -= 1
                        return true
                    }
                    s.waiters.append(Waiter(id: id, continuation: continuation))
                    return nil
                }
                switch resumeNow {
                case true?: continuation.resume()
                case false?: continuation.resume(throwing: CancellationError())
                case nil: break
                }
            }
        } onCancel: {
            let cancelled: CheckedContinuation<Void, any Error>? = state.withLock { s in
                guard let index = s.waiters[s.head...].firstIndex(where: { $0.id == id }) else { return nil }
                let waiter = s.waiters.remove(at: index)
                return waiter.continuation
            }
            cancelled?.resume(throwing: CancellationError())
        }
    }

    /// Returns `count` slots at once (one lock when nobody waits).
    func release(count: Int) {
        guard count > 0 else { return }
        let handedOver: Int = state.withLock { s in
            let waiting = s.waiters.count - s.head
            if waiting == 0 { s.available += count }
            return waiting == 0 ? count : 0
        }
        for _ in handedOver..<count { release() }
    }

    func release() {
        let next: CheckedContinuation<Void, any Error>? = state.withLock { s in
            if s.head < s.waiters.count {
                let waiter = s.waiters[s.head]
                s.head += 1
                if s.head > 1024, s.head * 2 > s.waiters.count {
                    s.waiters.removeFirst(s.head)
                    s.head = 0
                }
                return waiter.continuation
            }
            s.available += 1
            return nil
        }
        next?.resume()
    }
}
