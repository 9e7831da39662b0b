import Foundation
import HeraldRuntime
import Synchronization

/// The running server's libmicrohttpd side: one `WorkerLoop` (thread + daemon) per configured thread, all
/// accepting on the same listening socket (each daemon owns its own `dup` of it), sharing one
/// `ConnectionHandler`. Stops everything exactly once, at the latest in `deinit`.
final class MicroHTTPDaemon: Sendable {
    private let loops: [WorkerLoop]
    private let handler: ConnectionHandler
    private let stopped = Atomic<Bool>(false)

    init(listening descriptor: Int32, configuration: HTTPServerConfiguration,
         engine: RequestEngine) throws(HTTPServerError) {
        handler = ConnectionHandler(engine: engine)
        let count = configuration.threads
        let perLoopLimit = (configuration.maxConnections + count - 1) / count
        let addresses = AddressCounter(limit: configuration.maxConnectionsPerAddress)
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
        var loops: [WorkerLoop] = []
        for (index, fd) in descriptors.enumerated() {
            do {
                loops.append(try WorkerLoop(listening: fd, configuration: configuration, connectionLimit: perLoopLimit,
                                            addresses: addresses, handler: handler, name: "herald-http-\(index)"))
            } catch {
                descriptors[(index + 1)...].forEach { close($0) }
                for loop in loops {
                    loop.stopLoop()
                    loop.stopDaemon()
                }
                throw error
            }
        }
        self.loops = loops
    }

    /// Stops accepting: new connections are refused while open ones finish; responses say `Connection: close`.
    func quiesce() {
        handler.engine.draining = true
        for loop in loops { loop.quiesce() }
    }

    func expireOverdue() { handler.expireOverdue() }

    /// Answers 503 to every request whose handler still runs; see `ConnectionHandler.failParked`.
    func failParked() -> Int { handler.failParked() }

    /// Closes every connection and ends the threads. Parked requests are answered first, because libmicrohttpd
    /// aborts the process when stopped with a connection still suspended.
    func stop() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        _ = handler.failParked()
        handler.stopResuming()
        for loop in loops { loop.stopLoop() }
        for loop in loops { loop.stopDaemon() }
    }

    deinit { stop() }
}
