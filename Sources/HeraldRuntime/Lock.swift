import Foundation

/// A value reached only under a pthread mutex: `Synchronization.Mutex`'s `withLock`, on a lock ThreadSanitizer sees.
///
/// Why not `Mutex`: on Linux it hands a contended lock over with `FUTEX_LOCK_PI` inside the uninstrumented Swift
/// runtime, so ThreadSanitizer never sees the hand-over and reports every contended critical section as a race
/// (RELIABILITY.md, "Sanitizers", has the five-line reproduction). `pthread_mutex_lock` is intercepted by the
/// sanitizers and costs the same when uncontended.
public final class Lock<Value: ~Copyable>: @unchecked Sendable { // `value` is only reached between lock and unlock of `mutex`
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private var value: Value

    /// A lock guarding `initialValue`.
    public init(_ initialValue: consuming Value) {
        value = initialValue
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    /// Runs `body` with exclusive access to the value; not reentrant (a nested call on the same lock deadlocks).
    public func withLock<Result: ~Copyable, E: Error>(_ body: (inout Value) throws(E) -> Result) throws(E) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
