import Foundation
import HeraldRuntime
import Synchronization

/// The running server's loops: one `WorkerLoop` (thread + epoll set) per configured thread, all accepting on the
/// same listening socket (each loop owns its own `dup` of it), sharing one `ParkedRequests`. Stops everything
/// exactly once, at the latest in `deinit`.
final class HTTPWorkers: Sendable {
    private let loops: [WorkerLoop]
    private let parked: ParkedRequests
    private let stopped = Atomic<Bool>(false)

    init(listening descriptor: Int32, configuration: HTTPServerConfiguration,
         engine: RequestEngine) throws(HTTPServerError) {
        parked = ParkedRequests(engine: engine)
        let count = configuration.threads
        let perLoopLimit = (configuration.maxConnections + count - 1) / count
        let addresses = AddressCounter(limit: configuration.maxConnectionsPerAddress,
                                       ipv6PrefixLength: configuration.ipv6PrefixLength)
        var descriptors = [descriptor]
        for _ in 1..<count {
            let copy = dup(descriptor)
            guard copy >= 0 else {
                let reason = String(cString: strerror(errno))
                descriptors.forEach { close($0) }
                throw HTTPServerError(.startFailed, "dup of the listening socket: \(reason)")
            }
            descriptors.append(copy)
        }
        // Accepted sockets must not block: the listener itself is non-blocking so an accept raced by another
        // loop returns EAGAIN instead of waiting.
        _ = fcntl(descriptor, F_SETFL, fcntl(descriptor, F_GETFL) | O_NONBLOCK)
        var loops: [WorkerLoop] = []
        for (index, fd) in descriptors.enumerated() {
            do {
                loops.append(try WorkerLoop(listening: fd, configuration: configuration, connectionLimit: perLoopLimit,
                                            addresses: addresses, parked: parked, name: "herald-http-\(index)"))
            } catch {
                descriptors[(index + 1)...].forEach { close($0) }
                for loop in loops { loop.stop() }
                throw error
            }
        }
        self.loops = loops
    }

    /// Stops accepting: new connections are refused while open ones finish; responses say `Connection: close`.
    func quiesce() {
        parked.engine.draining = true
        for loop in loops { loop.quiesce() }
    }

    func expireOverdue() { parked.expireOverdue() }

    /// Answers 503 to every request whose handler still runs; see `ParkedRequests.failParked`.
    func failParked() -> Int { parked.failParked() }

    /// Closes every connection and ends the threads; requests whose handler still runs are answered 503 first.
    func stop() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        _ = parked.failParked()
        for loop in loops { loop.stop() }
    }

    deinit { stop() }
}
