import Foundation

/// Readiness of a descriptor a `ThreadEventLoop` watches.
public struct DescriptorEvents: OptionSet, Sendable, Hashable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    public static let readable = DescriptorEvents(rawValue: 1)
    public static let writable = DescriptorEvents(rawValue: 2)
    /// An error or hang-up (reported only; never asked for).
    public static let failed = DescriptorEvents(rawValue: 4)
    /// The peer shut down its sending side: everything it sent is in the socket (reported only).
    public static let peerClosed = DescriptorEvents(rawValue: 8)
}

/// Something a `ThreadEventLoop` drives on its thread: a non-blocking connection, typically, owned by code that runs
/// on that loop (a Redis client's per-loop connection).
///
/// Every method is called on the loop's thread only, so an implementation needs no locks for state it keeps to
/// that thread.
public protocol LoopClient: AnyObject {
    /// A descriptor this client watches is ready (or failed).
    func descriptorReady(_ descriptor: Int32, events: DescriptorEvents)
    /// Runs at the end of every loop turn, after the turn's jobs and before the loop waits or turns again: where
    /// writes buffered during the turn go out together, and where deadlines are checked (the loop turns at least
    /// every 100 ms while any client is attached).
    func endOfTurn(now: ContinuousClock.Instant)
    /// The loop is stopping: fail what waits and release the descriptors. The client is detached afterwards.
    func loopStopped()
}

/// An event loop that runs on one thread of its own and lets code running on that thread (a task whose executor
/// is the loop) drive descriptors with the loop's own wait, instead of handing work to another thread.
///
/// All methods but `execute` must be called on the loop's thread, that is where `LoopThread.current` is this loop.
public protocol ThreadEventLoop: AnyObject, Sendable {
    /// Adds `client` to those told `endOfTurn` each turn and `loopStopped` at the end.
    func attach(_ client: any LoopClient)
    /// Removes `client` (and nothing else: unwatch its descriptors first).
    func detach(_ client: any LoopClient)
    /// Starts watching `descriptor` for `interest` (readable and/or writable), or changes the interest of one
    /// already watched; readiness goes to `client.descriptorReady`. Returns false with errno set on failure.
    func watch(_ descriptor: Int32, for interest: DescriptorEvents, client: any LoopClient) -> Bool
    /// Stops watching `descriptor`; call before closing it.
    func unwatch(_ descriptor: Int32)
    /// Per-loop values, keyed by their owner's identity (one Redis connection per client and loop).
    func value(forKey key: ObjectIdentifier) -> AnyObject?
    /// Stores (or, with nil, removes) the value for `key` on this loop.
    func setValue(_ value: AnyObject?, forKey key: ObjectIdentifier)
    /// Runs `operation` on the loop's thread at the start of a coming turn; callable from any thread. Operations
    /// queued after the loop has stopped are dropped.
    func execute(_ operation: @escaping @Sendable () -> Void)
}

/// Which `ThreadEventLoop`, if any, runs on the calling thread.
public enum LoopThread {
    /// Holds the loop for the thread-local slot, which stores a plain pointer.
    private final class Box {
        let loop: any ThreadEventLoop
        init(_ loop: any ThreadEventLoop) { self.loop = loop }
    }

    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        precondition(pthread_key_create(&key, nil) == 0, "pthread_key_create failed")
        return key
    }()

    /// The loop running on this thread; nil on every other thread (Swift's pool, threads of other clients).
    public static var current: (any ThreadEventLoop)? {
        guard let raw = pthread_getspecific(key) else { return nil }
        return Unmanaged<Box>.fromOpaque(raw).takeUnretainedValue().loop
    }

    /// Called by a loop's thread when it starts (with the loop) and when it ends (with nil).
    public static func setCurrent(_ loop: (any ThreadEventLoop)?) {
        if let raw = pthread_getspecific(key) { Unmanaged<Box>.fromOpaque(raw).release() }
        let box = loop.map { Unmanaged.passRetained(Box($0)).toOpaque() }
        pthread_setspecific(key, box)
    }
}
