import Foundation

/// A value reached only under a pthread mutex: `Synchronization.Mutex`'s `withLock`, on a lock ThreadSanitizer sees.
///
/// Why not `Mutex`: on Linux it hands a contended lock over with `FUTEX_LOCK_PI` inside the uninstrumented Swift
/// runtime, so ThreadSanitizer never sees the hand-over and reports every contended critical section as a race
/// (RELIABILITY.md, "Sanitizers", has the five-line reproduction). `pthread_mutex_lock` is intercepted by the
/// sanitizers and costs the same when uncontended.
///
/// `withLock` is inlinable so that callers in other modules get it specialised for their value and result types,
/// as `Mutex`'s is: unspecialised, every call went through generic metadata and value witnesses (a request on
/// the ingest hot path takes a dozen locks).
public final class Lock<Value: ~Copyable>: @unchecked Sendable { // `value` is only reached between lock and unlock of `mutex`
    @usableFromInline let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    @usableFromInline var value: Value

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
    @inlinable
    public func withLock<Result: ~Copyable, E: Error>(_ body: (inout Value) throws(E) -> Result) throws(E) -> Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }

    /// Runs `body` only if the lock is free right now; nil when another thread holds it. For a fatal-signal
    /// handler, which must never wait (the thread that crashed may hold the lock).
    public func withLockIfAvailable<Result>(_ body: (inout Value) -> Result) -> Result? {
        guard pthread_mutex_trylock(mutex) == 0 else { return nil }
        defer { pthread_mutex_unlock(mutex) }
        return body(&value)
    }
}
