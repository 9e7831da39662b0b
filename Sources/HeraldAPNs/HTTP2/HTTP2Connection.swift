// Over 400 lines: one APNs connection's life (address by address, TLS, HTTP/2 with its PINGs and timeouts) is one state machine; sockets come from SocketConnector, TLS from HeraldTLS, frames from HTTP2ClientSession.
import Foundation
import HeraldRuntime
import HeraldTLS
internal import CHeraldShims

/// One HTTP/2-over-TLS connection to APNs: a non-blocking socket, a `TLSStream` and an nghttp2 client session.
///
/// Lives on the loop thread only. nghttp2 callbacks never close the connection themselves (the session must not
/// be deleted inside its own callback): they record what happened and `afterIO` acts on it.
final class HTTP2Connection: EventLoopHandler, HTTP2SessionEvents, @unchecked Sendable {  // @unchecked: confined to the loop thread; other threads only hold it to post work back.
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
    /// When SETTINGS made it ready.
    private(set) var readyAt: ContinuousClock.Instant?
    /// Whether a request got an answer here other than 503 Shutdown: a connection the server drops (or shuts down)
    /// before that is a failed attempt, for the pool's backoff, even after its handshake.
    private(set) var hasAnswered = false
    /// Whether any request got its answer here, 503 Shutdown included.
    private(set) var answeredAnything = false
    /// The debug data of the server's GOAWAY (APNs puts `{"reason": …}` there), for the requests it refused.
    private(set) var goawayDetail: String?
    /// `" (GOAWAY <debug data>)"` for messages about requests the GOAWAY refused; empty without one.
    var goawayNote: String { goawayDetail.map { " (GOAWAY \($0))" } ?? "" }

    private var fd: Int32 = -1
    private var tls: TLSStream?
    private var session: HTTP2ClientSession?
    private var writeInterest = false
    private var addresses: [SocketAddress] = []
    private var nextAddress = 0
    private var attemptsLeft = 0
    /// The address being connected to, and when it is given up for the next one (nil on the last address).
    private var address: SocketAddress?
    private var addressDeadline: ContinuousClock.Instant?
    private var outgoing: [UInt8] = []
    private var outgoingOffset = 0
    var isDirty = false

    private(set) var streams: [Int32: PendingRequest] = [:]
    private(set) var remoteMaximumStreams = 1
    private(set) var peakActiveStreams = 0
    private(set) var streamsOpened = 0
    private var establishDeadline: ContinuousClock.Instant
    private var lastReceived: ContinuousClock.Instant
    private var pingSentAt: ContinuousClock.Instant?
    /// `terminate` sent our own GOAWAY: the session's end is no protocol error of the server's.
    private var terminating = false
    /// Something a callback saw that the pool must hear about once the callback has returned.
    private var becameReady = false
    private var capacityChanged = false
    private var drainingStarted = false

    init(id: Int, endpoint: APNsEndpoint, pool: ConnectionPool, core: ClientCore, logger: Logger) {
        self.id = id
        self.endpoint = endpoint
        self.pool = pool
        self.core = core
        self.logger = logger.with(["apns.connection": String(id)])
        let now = ContinuousClock.now
        establishDeadline = now + core.configuration.connectTimeout
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
        // As curl --resolve writes them: an IPv6 address may be in brackets.
        let hosts = core.configuration.addressOverrides[endpoint.host.lowercased()]?.split(separator: ",").map {
            $0.trimmingCharacters(in: CharacterSet(charactersIn: " []"))
        } ?? [endpoint.host]
        let port = endpoint.port, loop = core.loop
        Thread.named("apns-resolve") { [self] in
            let result = SocketConnector.resolve(hosts: hosts, port: port)
            loop.execute { self.connect(result) }
        }.start()
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
        self.address = address
        switch SocketConnector.startConnecting(to: address, endpoint: endpoint) {
        case .success(let descriptor): fd = descriptor
        case .failure(let error): return connectNextAddress(after: error)
        }
        addressDeadline = attemptsLeft > 0 ? .now + core.configuration.addressConnectTimeout : nil
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
        do { tls = try TLSStream(context: core.tls(for: endpoint), descriptor: fd, serverName: endpoint.host) } catch {
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
        case .failed(let failure) where failure.certificateRefused:
            close(APNsError(.tlsFailure, "TLS with \(endpoint): \(failure.message)"))
        case .failed(let failure):
            // Any other failed handshake (a server's alert, a corrupted record) may pass, as a dropped one does.
            close(APNsError(.connectionFailed, "TLS handshake with \(endpoint) failed: \(failure.message)"))
        case .closedByPeer:
            // Reset or closed without a TLS alert: the network's failure, not a certificate's, so worth a retry.
            close(APNsError(.connectionFailed, "\(endpoint) closed the connection during the TLS handshake"))
        }
    }

    private func startHTTP2() {
        guard let session = HTTP2ClientSession(events: self) else {
            return close(APNsError(.protocolError, "nghttp2_session_client_new failed"))
        }
        self.session = session
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
                lastReceived = .now
                if let error = session.receive(UnsafeBufferPointer(rebasing: buffer[..<count])) {
                    return close(APNsError(.protocolError, "HTTP/2: \(error)"))
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
        // Writing can close streams too (our RST_STREAM is sent): their slots go to waiting requests now, not
        // after the next read.
        defer { reportToPool() }
        while true {
            if outgoingOffset == outgoing.count {
                outgoing.removeAll(keepingCapacity: true)
                outgoingOffset = 0
                if let error = session.takeOutgoing(into: &outgoing, limit: 65_536) {
                    return close(APNsError(.protocolError, "HTTP/2: \(error)"))
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
        if session.isFinished, state != .draining, !terminating {
            // nghttp2 refused what the server sent and said so with its GOAWAY: nothing more will be answered here.
            close(APNsError(.protocolError, "HTTP/2: \(endpoint) broke the protocol; the session ended"))
        } else if state == .draining, !terminating, streams.isEmpty || session.isFinished {
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
            readyAt = .now
            pool.connectionBecameReady(self)
        }
        reportToPool()
        core.markDirty(self)
    }

    /// Tells the pool that this connection started draining (it opens a replacement) or has room for more streams.
    private func reportToPool() {
        guard state != .closed else { return }
        if drainingStarted {
            drainingStarted = false
            pool.connectionStartedDraining(self)
        }
        if capacityChanged {
            capacityChanged = false
            pool.needsDispatch()
        }
    }

    // MARK: Streams

    /// Opens a stream for `request`. Returns false when the session refuses (the caller re-queues it).
    func submit(_ request: PendingRequest) -> Bool {
        guard let session, state == .ready else { return false }
        let streamID: Int32
        switch session.submit(request) {
        case .success(let id): streamID = id
        case .failure(let refusal):
            logger.warning("stream refused by nghttp2", ["apns.error": refusal.message])
            startDraining()
            pool.connectionStartedDraining(self)
            return false
        }
        streams[streamID] = request
        request.attempts += 1
        streamsOpened += 1
        peakActiveStreams = max(peakActiveStreams, streams.count)
        // Stream ids are 31 bits; at APNs rates they run out in hours, so hand over before they do.
        if session.nextStreamID > 0x7FFF_0000 {
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
        session?.cancel(stream: streamID)
        core.markDirty(self)
    }

    /// Resets the stream of a cancelled request.
    func cancel(_ request: PendingRequest) {
        guard let streamID = streams.first(where: { $0.value === request })?.key else { return }
        session?.cancel(stream: streamID)
        core.markDirty(self)
    }

    /// Timeouts: connection establishment, requests, and PING health checks.
    func tick(now: ContinuousClock.Instant) {
        switch state {
        case .resolving, .connecting, .handshaking, .awaitingSettings:
            if state == .connecting, let addressDeadline, now >= addressDeadline, now < establishDeadline {
                let error = APNsError(.connectionFailed, "connect to \(endpoint) at \(address?.text ?? "?"): "
                                      + "no answer within \(core.configuration.addressConnectTimeout)")
                logger.warning("APNs address did not answer; trying the next", ["error": error.message])
                connectNextAddress(after: error)
            } else if now >= establishDeadline {
                close(APNsError(.connectionFailed, "connecting to \(endpoint) timed out after \(core.configuration.connectTimeout) (\(state))"))
            }
        case .ready, .draining:
            var timedOut = false
            for (streamID, request) in streams where !request.isDone && request.deadline <= now {
                timeOut(streamID, request)
                timedOut = true
            }
            if let sent = pingSentAt {
                if now - sent >= core.configuration.pingTimeout {
                    close(APNsError(.connectionFailed, "\(endpoint) did not answer PING within \(core.configuration.pingTimeout)"))
                }
            } else if timedOut || now - lastReceived >= core.configuration.pingInterval, let session {
                // A request that timed out checks its connection at once: a dead one is closed within the PING
                // timeout, not left to take the retries too until the idle check.
                session.ping()
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
            session.terminate()
            terminating = true
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
                notProcessed(request, "\(endpoint) did not process the request\(goawayDetail == nil ? " (GOAWAY)" : goawayNote)")
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
        session = nil
        tls = nil
        if fd >= 0 {
            core.loop.unregister(fd)
            Glibc.close(fd)
            fd = -1
        }
    }

    // MARK: What the HTTP/2 session saw (called from inside `receive`; `afterIO` acts on it)

    func settingsReceived(maximumConcurrentStreams: Int) {
        remoteMaximumStreams = maximumConcurrentStreams
        capacityChanged = true
        if state == .awaitingSettings {
            state = .ready
            becameReady = true
        }
    }

    func pingAcknowledged() { pingSentAt = nil }

    func goawayReceived(lastStreamID: Int32, errorCode: UInt32, reason: String) {
        for (streamID, request) in streams where streamID > lastStreamID {
            request.notProcessed = true
        }
        // The server's debug data, capped: a frame's worth of it is no log line.
        let detail = String(reason.prefix(256))
        logger.warning("APNs sent GOAWAY", ["apns.last_stream_id": String(lastStreamID),
                                            "apns.error_code": String(errorCode), "apns.reason": detail])
        if !detail.isEmpty { goawayDetail = detail }
        if state == .ready || state == .awaitingSettings {
            state = .draining
            drainingStarted = true
        }
    }

    func responseEnded(_ request: PendingRequest) { request.responseComplete = true }

    private static let statusName: StaticString = ":status"
    private static let apnsIDName: StaticString = "apns-id"
    private static let uniqueIDName: StaticString = "apns-unique-id"
    private static let channelIDName: StaticString = "apns-channel-id"
    /// Broadcasts and channel requests answer with `apns-request-id` where pushes have `apns-id`.
    private static let requestIDName: StaticString = "apns-request-id"

    private static func matches(_ name: UnsafeBufferPointer<UInt8>, _ expected: StaticString) -> Bool {
        name.count == expected.utf8CodeUnitCount && memcmp(name.baseAddress!, expected.utf8Start, name.count) == 0
    }

    func headerReceived(_ request: PendingRequest, name: UnsafeBufferPointer<UInt8>,
                                    value: UnsafeBufferPointer<UInt8>) {
        if Self.matches(name, Self.statusName) {
            var status = 0
            for digit in value { status = status * 10 + Int(digit &- UInt8(ascii: "0")) }
            request.status = status
        } else if Self.matches(name, Self.apnsIDName) {
            request.apnsID = String(decoding: value, as: UTF8.self)
        } else if Self.matches(name, Self.uniqueIDName) {
            request.uniqueID = String(decoding: value.prefix(64), as: UTF8.self)
        } else if Self.matches(name, Self.requestIDName) {
            request.apnsID = String(decoding: value.prefix(64), as: UTF8.self)
        } else if Self.matches(name, Self.channelIDName) {
            request.channelID = String(decoding: value.prefix(256), as: UTF8.self)
        }
    }

    func dataReceived(_ request: PendingRequest, data: UnsafeBufferPointer<UInt8>) {
        // Error bodies are tiny JSON; cap what a misbehaving server can make us hold.
        let limit = request.status == 200 ? request.successBodyLimit : 4096
        let room = limit - request.responseBody.count
        guard room > 0 else { return }
        request.responseBody.append(contentsOf: data.prefix(room))
    }

    func streamClosed(_ stream: Int32, _ ending: HTTP2StreamEnding) {
        guard let request = streams.removeValue(forKey: stream) else { return }
        capacityChanged = true
        if request.status != 0, ending == .noError || request.responseComplete {
            answeredAnything = true
            // APNs answers 503 Shutdown on a connection it is taking down, 400 IdleTimeout on one idle too long: new
            // requests belong on another one. That answer does not make the connection one that worked (the pool's
            // backoff): a server answering it on every new connection must not get a connect per push.
            if request.status == 503 || request.status == 400,
               let reason = APNsResponse(status: request.status, apnsID: nil, body: request.responseBody).reason,
               reason == .shutdown || reason == .idleTimeout {
                if state == .ready {
                    state = .draining
                    drainingStarted = true
                }
            } else {
                hasAnswered = true
            }
            request.resolve(.success(RawResponse(status: request.status, apnsID: request.apnsID,
                                                 uniqueID: request.uniqueID, channelID: request.channelID,
                                                 body: request.responseBody)))
        } else if request.notProcessed || ending == .refused {
            notProcessed(request, "\(endpoint) refused the stream\(goawayNote); it was not processed")
        } else {
            let reason = if case .error(let text) = ending { text } else { "NO_ERROR" }
            request.fail(.protocolError, "\(endpoint) reset the stream: \(reason)")
        }
    }

    /// The server did not process `request` (REFUSED_STREAM, or above a GOAWAY's last-stream-id), so it cannot
    /// have been delivered: send it again on a usable connection, or report it when attempts or time ran out.
    private func notProcessed(_ request: PendingRequest, _ message: String) {
        guard request.mayRetry(now: .now) else { return request.fail(.notProcessed, message) }
        request.resetForRetry()
        pool.retry(request)
    }
}
