// Over 400 lines: one APNs connection's life (address by address, then TLS, then the HTTP/2 session with its PINGs and timeouts) is one state machine; sockets come from SocketConnector, TLS from HeraldTLS.
import Foundation
import HeraldRuntime
internal import CNghttp2
import HeraldTLS
internal import CHeraldShims

/// One HTTP/2-over-TLS connection to APNs: a non-blocking socket, a `TLSStream` and an nghttp2 client session.
///
/// Lives on the loop thread only. nghttp2 callbacks never close the connection themselves (the session must not
/// be deleted inside its own callback): they record what happened and `afterIO` acts on it.
final class HTTP2Connection: EventLoopHandler, @unchecked Sendable {  // @unchecked: confined to the loop thread; other threads only hold it to post work back.
    enum State: String {
        case resolving, connecting, handshaking, awaitingSettings, ready, draining, closed
    }

    let id: Int
    let endpoint: APNsEndpoint
    private unowned let pool: ConnectionPool
    private unowned let core: ClientCore
    private let logger: Logger
    private(set) var state: State = .resolving
    private(set) var wasReady = false

    private var fd: Int32 = -1
    private var tls: TLSStream?
    private var session: OpaquePointer?
    private var writeInterest = false
    private var addresses: [SocketAddress] = []
    private var nextAddress = 0
    private var attemptsLeft = 0
    private var outgoing: [UInt8] = []
    private var outgoingOffset = 0
    var isDirty = false

    private(set) var streams: [Int32: PendingRequest] = [:]
    private(set) var remoteMaximumStreams = 1
    private(set) var peakActiveStreams = 0
    private(set) var streamsOpened = 0
    private var establishDeadline: UInt64
    private var lastReceived: UInt64
    private var pingSentAt: UInt64?
    /// Something a callback saw that the pool must hear about once the callback has returned.
    private var becameReady = false
    private var capacityChanged = false
    private var goawayReceived = false

    init(id: Int, endpoint: APNsEndpoint, pool: ConnectionPool, core: ClientCore, logger: Logger) {
        self.id = id
        self.endpoint = endpoint
        self.pool = pool
        self.core = core
        self.logger = logger.with(["apns.connection": String(id)])
        let now = Monotonic.now()
        establishDeadline = now + UInt64(clamping: core.configuration.connectTimeout.inNanoseconds)
        lastReceived = now
    }

    deinit { teardown() }

    var activeStreams: Int { streams.count }

    /// True when a new stream may be opened now.
    var hasCapacity: Bool {
        state == .ready && streams.count < min(remoteMaximumStreams, core.configuration.maximumStreamsPerConnection)
    }

    // MARK: Connecting

    /// Resolves the host on a short-lived thread (getaddrinfo blocks), then connects on the loop.
    func start() {
        let host = endpoint.host, port = endpoint.port, loop = core.loop
        Thread.detachNewThread { [self] in
            let result = SocketConnector.resolve(host: host, port: port)
            loop.execute { self.connect(result) }
        }
    }

    private func connect(_ resolution: Result<[SocketAddress], APNsError>) {
        guard state == .resolving else { return }
        switch resolution {
        case .failure(let error): return close(error)
        case .success(let list): addresses = list
        }
        // Successive connections of a pool start at different addresses; each tries them all in turn.
        nextAddress = id % addresses.count
        attemptsLeft = addresses.count
        connectNextAddress(after: nil)
    }

    private func connectNextAddress(after error: APNsError?) {
        if fd >= 0 {
            core.loop.unregister(fd)
            Glibc.close(fd)
            fd = -1
        }
        guard attemptsLeft > 0 else {
            return close(error ?? APNsError(.connectionFailed, "no address of \(endpoint) accepted a connection"))
        }
        attemptsLeft -= 1
        let address = addresses[nextAddress % addresses.count]
        nextAddress += 1
        switch SocketConnector.startConnecting(to: address, endpoint: endpoint) {
        case .success(let descriptor): fd = descriptor
        case .failure(let error): return connectNextAddress(after: error)
        }
        state = .connecting
        writeInterest = true
        core.loop.register(fd, self, for: [.readable, .writable])
    }

    func handle(events: DescriptorEvents) {
        switch state {
        case .connecting:
            if let error = SocketConnector.pendingError(fd, endpoint: endpoint) { return connectNextAddress(after: error) }
            startTLS()
        case .handshaking:
            continueHandshake()
        case .awaitingSettings, .ready, .draining:
            readAvailable()
            afterIO()
        case .resolving, .closed:
            break
        }
    }

    private func startTLS() {
        do { tls = try TLSStream(context: core.tls, descriptor: fd, serverName: endpoint.host) } catch {
            return close(APNsError(.tlsFailure, error.message))
        }
        state = .handshaking
        continueHandshake()
    }

    private func continueHandshake() {
        guard let tls else { return }
        switch tls.handshake() {
        case .done:
            guard tls.negotiatedH2 else { return close(APNsError(.http2NotNegotiated, "\(endpoint) did not select ALPN h2")) }
            startHTTP2()
        case .wouldBlock(let wantsWrite):
            setWriteInterest(wantsWrite)
        case .failed(let failure) where failure.peerRefusedALPN:
            close(APNsError(.http2NotNegotiated, "\(endpoint) does not offer ALPN h2" + failure.message))
        case .failed(let failure):
            close(APNsError(.tlsFailure, "TLS with \(endpoint): \(failure.message)"))
        case .closedByPeer:
            close(APNsError(.tlsFailure, "TLS with \(endpoint): handshake failed"))
        }
    }

    private func startHTTP2() {
        var callbacks: OpaquePointer?
        nghttp2_session_callbacks_new(&callbacks)
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, onFrameReceived)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, onHeader)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, onDataChunk)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, onStreamClose)
        var session: OpaquePointer?
        let context = Unmanaged.passUnretained(self).toOpaque()
        guard nghttp2_session_client_new(&session, callbacks, context) == 0, let session else {
            return close(APNsError(.protocolError, "nghttp2_session_client_new failed"))
        }
        self.session = session
        var settings = [nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0)]
        nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count)
        state = .awaitingSettings
        // The server's SETTINGS may already sit in OpenSSL's buffer: epoll would not report it again.
        readAvailable()
        afterIO()
    }

    // MARK: I/O

    private func readAvailable() {
        guard let tls, let session else { return }
        let buffer = core.readBuffer
        while state != .closed {
            switch tls.read(into: UnsafeMutableRawBufferPointer(buffer)) {
            case .done(let count):
                lastReceived = Monotonic.now()
                let consumed = nghttp2_session_mem_recv(session, buffer.baseAddress, count)
                if consumed < 0 {
                    return close(APNsError(.protocolError, "HTTP/2: \(String(cString: nghttp2_strerror(Int32(consumed))))"))
                }
            case .wouldBlock(let wantsWrite):
                if wantsWrite { setWriteInterest(true) }
                return
            case .closedByPeer:
                return close(APNsError(.connectionFailed, "\(endpoint) closed the connection"))
            case .failed(let failure):
                return close(APNsError(.connectionFailed, "connection to \(endpoint) lost: \(failure.message)"))
            }
        }
    }

    /// Writes what nghttp2 has queued until the socket would block. Batches frames into one TLS write.
    func flush() {
        isDirty = false
        guard let tls, let session, state != .closed else { return }
        while true {
            if outgoingOffset == outgoing.count {
                outgoing.removeAll(keepingCapacity: true)
                outgoingOffset = 0
                while outgoing.count < 65_536 {
                    var data: UnsafePointer<UInt8>?
                    let length = nghttp2_session_mem_send(session, &data)
                    if length < 0 {
                        return close(APNsError(.protocolError, "HTTP/2: \(String(cString: nghttp2_strerror(Int32(length))))"))
                    }
                    guard length > 0, let data else { break }
                    outgoing.append(contentsOf: UnsafeBufferPointer(start: data, count: length))
                }
                if outgoing.isEmpty { break }
            }
            let written = outgoing.withUnsafeBytes { tls.write(UnsafeRawBufferPointer(rebasing: $0[outgoingOffset...])) }
            switch written {
            case .done(let count):
                outgoingOffset += count
                continue
            case .wouldBlock(let wantsWrite):
                if wantsWrite { setWriteInterest(true) }
                return
            case .closedByPeer, .failed:
                let reason = if case .failed(let failure) = written { failure.message } else { "closed by the peer" }
                let error = APNsError(.connectionFailed, "write to \(endpoint) failed: \(reason)")
                // A server that closed after answering (GOAWAY, then close) may have left answers and its GOAWAY
                // unread here: take them before failing what is left, so answered requests are not reported lost
                // and the unprocessed ones are known to be safe to resend.
                readAvailable()
                return close(error)
            }
        }
        setWriteInterest(false)
        if state == .draining, streams.isEmpty {
            close(nil)
        }
    }

    private func setWriteInterest(_ wanted: Bool) {
        guard wanted != writeInterest, fd >= 0 else { return }
        writeInterest = wanted
        core.loop.modify(fd, for: wanted ? [.readable, .writable] : .readable)
    }

    /// Tells the pool what callbacks saw, and schedules a flush.
    private func afterIO() {
        guard state != .closed else { return }
        if becameReady {
            becameReady = false
            wasReady = true
            pool.connectionBecameReady(self)
        }
        if goawayReceived {
            goawayReceived = false
            pool.connectionStartedDraining(self)
        }
        if capacityChanged {
            capacityChanged = false
            pool.needsDispatch()
        }
        core.markDirty(self)
    }

    // MARK: Streams

    /// Opens a stream for `request`. Returns false when the session refuses (the caller re-queues it).
    func submit(_ request: PendingRequest) -> Bool {
        guard let session, state == .ready else { return false }
        // nghttp2 copies names and values during the call, so they may point into the request's buffer.
        let fields = request.headers.fields
        let context = Unmanaged.passUnretained(request).toOpaque()
        let streamID: Int32 = request.headers.bytes.withUnsafeBufferPointer { bytes in
            let base = UnsafeMutablePointer(mutating: bytes.baseAddress!)
            return withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: fields.count) { nameValues in
                for (index, field) in fields.enumerated() {
                    nameValues[index] = nghttp2_nv(name: base + field.nameStart, value: base + field.valueStart,
                                                   namelen: field.nameLength, valuelen: field.valueLength,
                                                   flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
                }
                var provider = nghttp2_data_provider()
                provider.read_callback = readBodyCallback
                // The stream's user data is the request, unretained: `streams` keeps it alive until nghttp2 closes
                // the stream (or the session is deleted).
                return nghttp2_submit_request(session, nil, nameValues.baseAddress, fields.count, &provider, context)
            }
        }
        guard streamID > 0 else {
            logger.warning("stream refused by nghttp2", ["apns.error": String(cString: nghttp2_strerror(streamID))])
            startDraining()
            return false
        }
        streams[streamID] = request
        request.attempts += 1
        streamsOpened += 1
        peakActiveStreams = max(peakActiveStreams, streams.count)
        // Stream ids are 31 bits; at APNs rates they run out in hours, so hand over before they do.
        if nghttp2_session_get_next_stream_id(session) > 0x7FFF_0000 {
            startDraining()
            pool.connectionStartedDraining(self)
        }
        core.markDirty(self)
        return true
    }

    /// Stops opening streams here; the pool opens a replacement, and this closes once its streams are done.
    func startDraining() {
        guard state == .ready || state == .awaitingSettings else { return }
        state = .draining
    }

    /// Fails a request whose deadline passed and resets its stream.
    func timeOut(_ streamID: Int32, _ request: PendingRequest) {
        request.fail(.timeout, "no answer from \(endpoint) within \(core.configuration.requestTimeout)")
        if let session { nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, NGHTTP2_CANCEL.rawValue) }
        core.markDirty(self)
    }

    /// Resets the stream of a cancelled request.
    func cancel(_ request: PendingRequest) {
        guard let streamID = streams.first(where: { $0.value === request })?.key else { return }
        if let session { nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, NGHTTP2_CANCEL.rawValue) }
        core.markDirty(self)
    }

    /// Timeouts: connection establishment, requests, and PING health checks.
    func tick(now: UInt64) {
        switch state {
        case .resolving, .connecting, .handshaking, .awaitingSettings:
            if now >= establishDeadline {
                close(APNsError(.connectionFailed, "connecting to \(endpoint) timed out after \(core.configuration.connectTimeout) (\(state))"))
            }
        case .ready, .draining:
            for (streamID, request) in streams where !request.isDone && request.deadline <= now {
                timeOut(streamID, request)
            }
            if let sent = pingSentAt {
                if now &- sent >= UInt64(clamping: core.configuration.pingTimeout.inNanoseconds) {
                    close(APNsError(.connectionFailed, "\(endpoint) did not answer PING within \(core.configuration.pingTimeout)"))
                }
            } else if now &- lastReceived >= UInt64(clamping: core.configuration.pingInterval.inNanoseconds), let session {
                nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil)
                pingSentAt = now
                core.markDirty(self)
            }
        case .closed:
            break
        }
    }

    /// Sends GOAWAY (best effort, without waiting), fails what is left with `error`, and closes.
    func terminate(failing error: APNsError) {
        if let session, state != .closed {
            nghttp2_session_terminate_session(session, NGHTTP2_NO_ERROR.rawValue)
            flush()
        }
        close(error)
    }

    /// Closes the socket and fails every unresolved stream with `error` (nil: a clean close after draining).
    func close(_ error: APNsError?) {
        guard state != .closed else { return }
        let previous = state
        state = .closed
        let failure = error ?? APNsError(.connectionFailed, "connection to \(endpoint) closed")
        let pending = streams
        streams.removeAll()
        for (_, request) in pending {
            if request.notProcessed {
                notProcessed(request, "\(endpoint) did not process the request (GOAWAY)")
            } else {
                request.resolve(.failure(failure))
            }
        }
        teardown()
        if let error, error.code != .shutdown {
            logger.warning("APNs connection closed", ["apns.error": error.message, "apns.state": previous.rawValue,
                                                      "apns.failed_requests": String(pending.count)])
        } else {
            logger.debug("APNs connection closed", ["apns.state": previous.rawValue])
        }
        pool.connectionClosed(self, error: error)
    }

    private func teardown() {
        if let session {
            nghttp2_session_del(session)
            self.session = nil
        }
        tls = nil
        if fd >= 0 {
            core.loop.unregister(fd)
            Glibc.close(fd)
            fd = -1
        }
    }

    // MARK: nghttp2 callback bodies

    fileprivate func frameReceived(_ frame: UnsafePointer<nghttp2_frame>) {
        let header = frame.pointee.hd
        let isAck = header.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) != 0
        switch UInt32(header.type) {
        case NGHTTP2_SETTINGS.rawValue where !isAck:
            guard let session else { return }
            let maximum = nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)
            remoteMaximumStreams = Int(min(maximum, UInt32(Int32.max)))
            capacityChanged = true
            if state == .awaitingSettings {
                state = .ready
                becameReady = true
            }
        case NGHTTP2_PING.rawValue where isAck:
            pingSentAt = nil
        case NGHTTP2_GOAWAY.rawValue:
            let goaway = frame.pointee.goaway
            var reason = ""
            if let data = goaway.opaque_data, goaway.opaque_data_len > 0 {
                reason = String(decoding: UnsafeBufferPointer(start: data, count: goaway.opaque_data_len), as: UTF8.self)
            }
            for (streamID, request) in streams where streamID > goaway.last_stream_id {
                request.notProcessed = true
            }
            logger.warning("APNs sent GOAWAY", ["apns.last_stream_id": String(goaway.last_stream_id),
                                                "apns.error_code": String(goaway.error_code), "apns.reason": reason])
            if state == .ready || state == .awaitingSettings {
                state = .draining
                goawayReceived = true
            }
        case NGHTTP2_HEADERS.rawValue, NGHTTP2_DATA.rawValue:
            if header.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0, let session,
               let request = Self.request(session, header.stream_id) {
                request.responseComplete = true
            }
        default:
            break
        }
    }

    private static let statusName: StaticString = ":status"
    private static let apnsIDName: StaticString = "apns-id"

    private static func matches(_ name: UnsafeBufferPointer<UInt8>, _ expected: StaticString) -> Bool {
        name.count == expected.utf8CodeUnitCount && memcmp(name.baseAddress!, expected.utf8Start, name.count) == 0
    }

    fileprivate func headerReceived(_ request: PendingRequest, name: UnsafeBufferPointer<UInt8>,
                                    value: UnsafeBufferPointer<UInt8>) {
        if Self.matches(name, Self.statusName) {
            var status = 0
            for digit in value { status = status * 10 + Int(digit &- UInt8(ascii: "0")) }
            request.status = status
        } else if Self.matches(name, Self.apnsIDName) {
            request.apnsID = String(decoding: value, as: UTF8.self)
        }
    }

    fileprivate func dataReceived(_ request: PendingRequest, data: UnsafeBufferPointer<UInt8>) {
        guard request.status != 200 else { return }
        // Error bodies are tiny JSON; cap what a misbehaving server can make us hold.
        let room = max(0, 4096 - request.responseBody.count)
        request.responseBody.append(contentsOf: data.prefix(room))
    }

    fileprivate func streamClosed(_ stream: Int32, errorCode: UInt32) {
        guard let request = streams.removeValue(forKey: stream) else { return }
        capacityChanged = true
        if request.status != 0, errorCode == NGHTTP2_NO_ERROR.rawValue || request.responseComplete {
            request.resolve(.success(RawResponse(status: request.status, apnsID: request.apnsID, body: request.responseBody)))
        } else if request.notProcessed || errorCode == NGHTTP2_REFUSED_STREAM.rawValue {
            notProcessed(request, "\(endpoint) refused the stream; it was not processed")
        } else {
            request.fail(.protocolError, "\(endpoint) reset the stream: \(String(cString: nghttp2_http2_strerror(errorCode)))")
        }
    }

    /// The server did not process `request` (REFUSED_STREAM, or above a GOAWAY's last-stream-id), so it cannot
    /// have been delivered: send it again on a usable connection, or report it when attempts or time ran out.
    private func notProcessed(_ request: PendingRequest, _ message: String) {
        guard request.mayRetry(now: Monotonic.now()) else { return request.fail(.notProcessed, message) }
        request.resetForRetry()
        pool.retry(request)
    }

    fileprivate static func readBody(_ request: PendingRequest, into buffer: UnsafeMutablePointer<UInt8>, length: Int,
                                     flags: UnsafeMutablePointer<UInt32>) -> Int {
        let count = min(length, request.body.count - request.bodyOffset)
        request.body.withUnsafeBufferPointer { body in
            buffer.update(from: body.baseAddress! + request.bodyOffset, count: count)
        }
        request.bodyOffset += count
        if request.bodyOffset == request.body.count { flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
        return count
    }
}

extension HTTP2Connection {
    /// The request a stream was opened for (its nghttp2 stream user data).
    fileprivate static func request(_ session: OpaquePointer, _ stream: Int32) -> PendingRequest? {
        guard let context = nghttp2_session_get_stream_user_data(session, stream) else { return nil }
        return Unmanaged<PendingRequest>.fromOpaque(context).takeUnretainedValue()
    }
}

// Capture-less nghttp2 callbacks: the session's user data is the connection (unretained; it outlives its session).

private func connection(_ context: UnsafeMutableRawPointer?) -> HTTP2Connection {
    Unmanaged<HTTP2Connection>.fromOpaque(context!).takeUnretainedValue()
}

private func onFrameReceived(_ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?,
                             _ context: UnsafeMutableRawPointer?) -> Int32 {
    if let frame { connection(context).frameReceived(frame) }
    return 0
}

private func onHeader(_ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ name: UnsafePointer<UInt8>?,
                      _ nameLength: Int, _ value: UnsafePointer<UInt8>?, _ valueLength: Int, _ flags: UInt8,
                      _ context: UnsafeMutableRawPointer?) -> Int32 {
    guard let session, let frame, let name, let value,
          let request = HTTP2Connection.request(session, frame.pointee.hd.stream_id) else { return 0 }
    connection(context).headerReceived(request, name: UnsafeBufferPointer(start: name, count: nameLength),
                                       value: UnsafeBufferPointer(start: value, count: valueLength))
    return 0
}

private func onDataChunk(_ session: OpaquePointer?, _ flags: UInt8, _ stream: Int32, _ data: UnsafePointer<UInt8>?,
                         _ length: Int, _ context: UnsafeMutableRawPointer?) -> Int32 {
    guard let session, let data, let request = HTTP2Connection.request(session, stream) else { return 0 }
    connection(context).dataReceived(request, data: UnsafeBufferPointer(start: data, count: length))
    return 0
}

private func onStreamClose(_ session: OpaquePointer?, _ stream: Int32, _ errorCode: UInt32,
                           _ context: UnsafeMutableRawPointer?) -> Int32 {
    connection(context).streamClosed(stream, errorCode: errorCode)
    return 0
}

private func readBodyCallback(_ session: OpaquePointer?, _ stream: Int32, _ buffer: UnsafeMutablePointer<UInt8>?, _ length: Int,
                      _ flags: UnsafeMutablePointer<UInt32>?, _ source: UnsafeMutablePointer<nghttp2_data_source>?,
                      _ context: UnsafeMutableRawPointer?) -> Int {
    guard let session, let buffer, let flags, let request = HTTP2Connection.request(session, stream) else {
        return Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue)
    }
    return HTTP2Connection.readBody(request, into: buffer, length: length, flags: flags)
}
