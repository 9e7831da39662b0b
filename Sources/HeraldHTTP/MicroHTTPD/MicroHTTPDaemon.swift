internal import CHeraldShims
internal import CMicroHTTPD
import Foundation
import HeraldRuntime
import Synchronization

/// Owns one running libmicrohttpd daemon (epoll, internal worker threads, suspend/resume) and stops it exactly
/// once, at the latest in `deinit`.
///
/// The callbacks get the `ConnectionHandler` as an unretained pointer: this object holds it strongly and stops the
/// daemon (after which no callback runs) before letting it go. The options struct is read by the log trampoline
/// for the daemon's whole life, so it is freed only after the stop.
// @unchecked: `handle` and `options` are written once in init and freed once in deinit; quiesce/stop are
// serialised by `lifecycle`, and libmicrohttpd's own calls on a running daemon are thread-safe.
final class MicroHTTPDaemon: @unchecked Sendable {
    private let handle: OpaquePointer
    private let options: UnsafeMutablePointer<herald_mhd_options>
    private let handler: ConnectionHandler
    private let lifecycle = Mutex<(quiesced: Bool, stopped: Bool)>((false, false))

    init(listening descriptor: Int32, configuration: HTTPServerConfiguration,
         engine: RequestEngine) throws(HTTPServerError) {
        handler = ConnectionHandler(engine: engine)
        let context = Unmanaged.passUnretained(handler).toOpaque()
        let timeout = configuration.connectionTimeout.components
        let timeoutSeconds = timeout.seconds + (timeout.attoseconds > 0 ? 1 : 0)

        options = .allocate(capacity: 1)
        options.initialize(to: herald_mhd_options(
            flags: MHD_USE_EPOLL_INTERNAL_THREAD.rawValue | MHD_ALLOW_SUSPEND_RESUME.rawValue,
            listen_fd: descriptor,
            thread_pool_size: UInt32(clamping: configuration.threads),
            connection_timeout_seconds: UInt32(clamping: timeoutSeconds),
            connection_limit: UInt32(clamping: configuration.maxConnections),
            access_handler: { cls, connection, url, method, _, uploadData, uploadSize, slot in
                guard let cls, let connection, let url, let method, let uploadSize, let slot else { return .NO }
                return Unmanaged<ConnectionHandler>.fromOpaque(cls).takeUnretainedValue()
                    .access(connection, url: url, method: method, uploadData: uploadData, uploadSize: uploadSize,
                            slot: slot)
            },
            access_handler_cls: context,
            request_completed: { cls, _, slot, code in
                guard let cls, let slot else { return }
                Unmanaged<ConnectionHandler>.fromOpaque(cls).takeUnretainedValue().completed(slot, code: code)
            },
            request_completed_cls: context,
            log: { cls, message in
                guard let cls, let message else { return }
                Unmanaged<ConnectionHandler>.fromOpaque(cls).takeUnretainedValue().engine.logger
                    .debug("libmicrohttpd: \(String(cString: message))")
            },
            log_cls: context))

        guard let started = herald_mhd_start(options) else {
            close(descriptor)
            options.deinitialize(count: 1)
            options.deallocate()
            throw HTTPServerError(.startFailed, "libmicrohttpd did not start (see debug log)")
        }
        handle = started
    }

    /// Stops accepting: new connections are refused while open ones finish; responses say `Connection: close`.
    func quiesce() {
        let first = lifecycle.withLock { state -> Bool in
            defer { state.quiesced = true }
            return !state.quiesced && !state.stopped
        }
        guard first else { return }
        handler.engine.draining = true
        let listening = MHD_quiesce_daemon(handle)
        // After quiescing, the listening socket is ours to close (MHD_stop_daemon no longer does).
        if listening >= 0 { close(listening) }
    }

    func expireOverdue() { handler.expireOverdue() }

    /// Answers 503 to every request whose handler still runs; see `ConnectionHandler.failParked`.
    func failParked() -> Int { handler.failParked() }

    /// Closes every connection and joins the worker threads. Parked requests are answered first, because
    /// libmicrohttpd aborts the process when stopped with a connection still suspended.
    func stop() {
        let first = lifecycle.withLock { state -> Bool in
            defer { state.stopped = true }
            return !state.stopped
        }
        guard first else { return }
        _ = handler.failParked()
        MHD_stop_daemon(handle)
    }

    deinit {
        stop()
        options.deinitialize(count: 1)
        options.deallocate()
    }
}
