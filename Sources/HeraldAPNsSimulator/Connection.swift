// Over 400 lines: the server side of one HTTP/2 connection (TLS, nghttp2 session, validation, delayed answers) is one state machine.
import Foundation
import HeraldCrypto
import HeraldRuntime
import HeraldTLS
internal import CNghttp2

/// One client connection: TLS handshake, then an nghttp2 server session driven by poll(2) on the connection's
/// own thread. Requests are validated when their last frame arrives and answered at once, or later when a
/// delay rule says so.
final class SimulatorConnection: @unchecked Sendable {  // @unchecked: created by the accept thread, then used only by its own thread.
    struct StreamState {
        var request = IncomingRequest()
        var handled = false
        var response: [UInt8] = []
        var responseOffset = 0
    }

    struct Answer {
        var streamID: Int32
        var status: Int
        var apnsID: String
        var rejection: APNsRejection?
        var push: AcceptedPush?
        var request: IncomingRequest
        /// Broadcasts and channel requests: the id goes back as `apns-request-id`, with these headers and body.
        var isChannelRequest = false
        var headers: [(String, String)] = []
        var body: [UInt8]?
        var broadcast: AcceptedBroadcast?
    }

    let descriptor: Int32
    let id: Int
    let simulator: APNsSimulator
    /// Accepted on the channel management listener: only `/1/apps/…` requests are served.
    let isManagement: Bool
    private let logger: Logger
    private var session: OpaquePointer?
    var streams: [Int32: StreamState] = [:]
    private var delayed = DueQueue<Answer>()
    private var outbound: [UInt8] = []
    /// Record lines of accepted pushes whose answers are not written yet (see `LineRecorder`).
    private var pendingRecords: [UInt8] = []
    private var outboundOffset = 0
    private var tokens: ProviderTokenTracker
    private var concurrencyRaised = false
    private var handledCount = 0
    private var highestHandled: Int32 = 0
    private var goawayLastStreamID: Int32?
    private var dropRequested = false
    private var lastActivity = ContinuousClock.now
    private var lastWriteProgress = ContinuousClock.now
    private var stopNoticed: ContinuousClock.Instant?

    /// How much one connection reads before it writes again, so a busy client cannot starve its answers. Small
    /// enough that a client keeping ~1,000 requests in flight gets answers while it is still sending (at 256 KiB
    /// the simulator read and processed ~700 requests before answering any, and client and simulator took turns
    /// idling), large enough that a read is not followed by a write syscall for every few requests.
    private static let readBudget = 32 * 1024
    private static let shutdownDeadline = Duration.seconds(2)
    private static let lingerTime = Duration.seconds(1)

    init(descriptor: Int32, id: Int, simulator: APNsSimulator, isManagement: Bool = false) {
        self.descriptor = descriptor
        self.id = id
        self.simulator = simulator
        self.isManagement = isManagement
        self.logger = simulator.logger.with(["sim.connection": "\(id)"])
        self.tokens = ProviderTokenTracker(minimumInterval: simulator.configuration.providerTokenMinimumRefresh)
    }

    func run() {
        defer {
            writeRecords()
            if let session { nghttp2_session_del(session) }
            close(descriptor)
            logger.debug("connection closed", ["sim.requests": "\(handledCount)"])
        }
        let tls: TLSStream
        do { tls = try TLSStream(context: simulator.tls, descriptor: descriptor, serverName: nil) } catch {
            logger.error("TLS set-up failed", ["error": "\(error)"])
            return
        }
        guard handshake(tls) else { return }
        guard tls.negotiatedH2 else {
            logger.debug("connection refused: no ALPN h2")
            tls.shutdown()
            return
        }
        logger.debug("connection open", ["sim.tls": tls.protocolVersion])
        guard startSession() else { return }
        serve(tls)
        if !dropRequested {
            tls.shutdown()
            linger()
        }
    }

    /// Closing a socket with unread input makes the kernel send RST, and the client's kernel may then drop the
    /// answers and the GOAWAY still on their way to it. So stop writing, and read (discarding) until the client
    /// closes too, for a short while.
    private func linger() {
        _ = Glibc.shutdown(descriptor, Int32(SHUT_WR))
        let deadline = ContinuousClock.now + Self.lingerTime
        let scratch = UnsafeMutableRawBufferPointer.allocate(byteCount: 16 * 1024, alignment: 8)
        defer { scratch.deallocate() }
        while ContinuousClock.now < deadline {
            var poller = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
            let ready = poll(&poller, 1, deadline.pollMilliseconds(cappedAt: .milliseconds(100)))
            if ready < 0, errno != EINTR { return }
            guard ready > 0 else { continue }
            let count = read(descriptor, scratch.baseAddress, scratch.count)
            if count == 0 || (count < 0 && errno != EAGAIN && errno != EINTR) { return }
        }
    }

    // MARK: TLS and I/O

    private func handshake(_ tls: TLSStream) -> Bool {
        let deadline = ContinuousClock.now + simulator.configuration.handshakeTimeout
        while true {
            switch tls.handshake() {
            case .done: return true
            case .closedByPeer, .failed:
                logger.debug("TLS handshake failed")
                return false
            case .wouldBlock(let wantsWrite):
                guard ContinuousClock.now < deadline, !simulator.isStopping else {
                    logger.debug("TLS handshake timed out")
                    return false
                }
                var poller = pollfd(fd: descriptor, events: Int16(wantsWrite ? POLLOUT : POLLIN), revents: 0)
                _ = poll(&poller, 1, deadline.pollMilliseconds(cappedAt: .milliseconds(100)))
            }
        }
    }

    private func startSession() -> Bool {
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else { return false }
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, simOnBeginHeaders)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, simOnHeader)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, simOnDataChunk)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, simOnFrame)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, simOnStreamClose)
        let context = Unmanaged.passUnretained(self).toOpaque()
        guard nghttp2_session_server_new(&session, callbacks, context) == 0 else { return false }
        // APNs starts every connection at one concurrent stream until a valid provider token was used on it.
        submitSettings(maxConcurrentStreams: 1)
        return true
    }

    private func submitSettings(maxConcurrentStreams: Int) {
        var entries = [
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue),
                                   value: UInt32(maxConcurrentStreams)),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue), value: 8000),
        ]
        _ = nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &entries, entries.count)
    }

    private func serve(_ tls: TLSStream) {
        let configuration = simulator.configuration
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 16 * 1024, alignment: 8)
        defer { buffer.deallocate() }
        while true {
            let now = ContinuousClock.now
            if simulator.isStopping {
                if stopNoticed == nil {
                    stopNoticed = now
                    // Shutting down: answer what is waiting now, then say goodbye.
                    for answer in delayed.takeDue(at: nil) { send(answer) }
                    goaway(reason: "Shutdown")
                } else if now - stopNoticed! > Self.shutdownDeadline {
                    return
                }
            }
            for answer in delayed.takeDue(at: now) { send(answer) }
            if goawayLastStreamID == nil, let rule = simulator.ruleBook.goaway(), handledCount >= rule.afterStreams {
                goaway(reason: rule.reason)
            }
            if goawayLastStreamID == nil, delayed.isEmpty, streams.isEmpty, now - lastActivity > configuration.idleTimeout {
                goaway(reason: "IdleTimeout")
            }
            guard flush(tls), !dropRequested else { return }
            let pendingOutput = outboundOffset < outbound.count
            if !pendingOutput, nghttp2_session_want_write(session) == 0 {
                if nghttp2_session_want_read(session) == 0 { return }
                if let last = goawayLastStreamID, delayed.isEmpty, !streams.keys.contains(where: { $0 <= last }) {
                    return
                }
            }
            if pendingOutput, now - lastWriteProgress > configuration.writeTimeout {
                logger.debug("peer stopped reading; dropping the connection")
                return
            }

            let timeout = (delayed.firstDue ?? now + .milliseconds(100)).pollMilliseconds(cappedAt: .milliseconds(100))
            var poller = pollfd(fd: descriptor, events: Int16(POLLIN) | (pendingOutput ? Int16(POLLOUT) : 0), revents: 0)
            let ready = poll(&poller, 1, timeout)
            if ready < 0, errno != EINTR { return }
            if ready > 0, poller.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 {
                guard readAvailable(tls, buffer) else { return }
            }
        }
    }

    /// Reads and feeds nghttp2 until the socket would block (or the read budget is spent). False: closed.
    private func readAvailable(_ tls: TLSStream, _ buffer: UnsafeMutableRawBufferPointer) -> Bool {
        var total = 0
        while total < Self.readBudget {
            switch tls.read(into: buffer) {
            case .done(let count):
                total += count
                lastActivity = .now
                let consumed = nghttp2_session_mem_recv(session, buffer.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                                        count)
                if consumed < 0 {
                    logger.debug("HTTP/2 protocol error", ["error": String(cString: nghttp2_strerror(Int32(consumed)))])
                    return false
                }
                if dropRequested { return true }
            case .wouldBlock:
                return true
            case .closedByPeer, .failed:
                return false
            }
        }
        return true
    }

    /// Serialises what nghttp2 has queued and writes it. False: the connection failed.
    private func flush(_ tls: TLSStream) -> Bool {
        writeRecords()
        while true {
            if outboundOffset < outbound.count {
                let result = outbound.withUnsafeBytes { tls.write(UnsafeRawBufferPointer(rebasing: $0[outboundOffset...])) }
                switch result {
                case .done(let count):
                    outboundOffset += count
                    lastWriteProgress = .now
                case .wouldBlock:
                    return true
                case .closedByPeer, .failed:
                    return false
                }
                continue
            }
            outbound.removeAll(keepingCapacity: true)
            outboundOffset = 0
            lastWriteProgress = .now
            while outbound.count < 64 * 1024 {
                var data: UnsafePointer<UInt8>?
                let count = nghttp2_session_mem_send(session, &data)
                if count < 0 { return false }
                if count == 0 { break }
                outbound.append(contentsOf: UnsafeBufferPointer(start: data, count: count))
            }
            if outbound.isEmpty { return true }
        }
    }

    /// Writes the record lines of the answers about to go out (before they can reach the client).
    private func writeRecords() {
        guard !pendingRecords.isEmpty else { return }
        simulator.recorder?.append(lines: pendingRecords)
        pendingRecords.removeAll(keepingCapacity: pendingRecords.count <= 1 << 20)
    }

    private func goaway(reason: String?) {
        guard goawayLastStreamID == nil else { return }
        let last = max(highestHandled, streams.filter { $0.value.handled }.keys.max() ?? 0)
        goawayLastStreamID = last
        var debug = reason.map { JSONValue.object(["reason": .string($0)]).encoded() } ?? []
        _ = nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), last, NGHTTP2_NO_ERROR.rawValue,
                                  &debug, debug.count)
        // Streams the client opened past last-stream-id were not processed: refuse them so it can retry elsewhere.
        for streamID in streams.keys where streamID > last {
            _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID,
                                          NGHTTP2_REFUSED_STREAM.rawValue)
        }
        logger.debug("GOAWAY sent", ["sim.last_stream_id": "\(last)", "apns.reason": reason ?? ""])
    }

    // MARK: Requests

    func requestComplete(_ streamID: Int32) {
        guard var state = streams[streamID], !state.handled else { return }
        // Checked here too, not only in the loop: one read can complete many requests.
        if goawayLastStreamID == nil, let rule = simulator.ruleBook.goaway(), handledCount >= rule.afterStreams {
            goaway(reason: rule.reason)
        }
        if let last = goawayLastStreamID, streamID > last {
            _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID,
                                          NGHTTP2_REFUSED_STREAM.rawValue)
            return
        }
        state.handled = true
        streams[streamID] = state
        handledCount += 1
        highestHandled = max(highestHandled, streamID)
        // The Nth stream: GOAWAY goes out before its answer, so a client that stops reading once its last
        // stream is answered still sees it.
        if goawayLastStreamID == nil, let rule = simulator.ruleBook.goaway(), handledCount >= rule.afterStreams {
            goaway(reason: rule.reason)
        }

        let request = state.request
        let now = Date().timeIntervalSince1970
        if isManagement || request.path?.hasPrefix("/4/broadcasts/") == true {
            return schedule(channelAnswer(streamID, request, now: now), after: configuredDelay())
        }
        let requestedID = request.header("apns-id")
        let apnsID = requestedID.flatMap { RequestValidator.isCanonicalUUID($0) ? $0 : nil }
            ?? RequestValidator.newAPNsID()
        var answer = Answer(streamID: streamID, status: 200, apnsID: apnsID, request: request)

        switch evaluate(request, now: now) {
        case .failure(let rejection):
            answer.status = rejection.status
            answer.rejection = rejection
            schedule(answer, after: configuredDelay())
        case .success(let push):
            answer.push = push
            let decision = simulator.ruleBook.decide(token: push.token, now: now)
            if let decision, decision.reset {
                logger.debug("rule: connection reset", ["apns.token": Redaction.tag(push.token)])
                dropRequested = true
                return
            }
            if let rejection = decision?.rejection {
                answer.status = rejection.status
                answer.rejection = rejection
            }
            schedule(answer, after: decision?.delay ?? configuredDelay())
        }
    }

    /// The simulator's round trip for one answer: `responseDelay`, a random point of it when it is a range.
    private func configuredDelay() -> Duration {
        guard let range = simulator.configuration.responseDelay else { return .zero }
        guard range.lowerBound < range.upperBound else { return range.lowerBound }
        let low = range.lowerBound.inMicroseconds, high = range.upperBound.inMicroseconds
        return .microseconds(Int64.random(in: low...high))
    }

    /// Sends `answer` now, or queues it in due order to be sent once `delay` has passed.
    private func schedule(_ answer: Answer, after delay: Duration) {
        guard delay > .zero else { return send(answer) }
        delayed.insert(answer, due: ContinuousClock.now + delay)
    }

    /// A channel management request or a broadcast: routed, authenticated, then checked by `BroadcastValidator`.
    private func channelAnswer(_ streamID: Int32, _ request: IncomingRequest, now: Double) -> Answer {
        let requestedID = request.header("apns-request-id")
        let requestID = requestedID.flatMap { RequestValidator.isCanonicalUUID($0) ? $0 : nil }
            ?? RequestValidator.newAPNsID()
        var answer = Answer(streamID: streamID, status: 200, apnsID: requestID, request: request, isChannelRequest: true)
        let book = simulator.channels
        let outcome: Result<(status: Int, headers: [(String, String)], body: [UInt8]?), APNsRejection>
        if isManagement {
            outcome = BroadcastValidator.managementRoute(request).flatMap { operation, bundle in
                if let rejection = refusal(request, bundle: bundle, now: now) {
                    return .failure(rejection)
                }
                return BroadcastValidator.manage(operation, bundle: bundle, request: request, book: book,
                                                 enabled: simulator.broadcastEnabled(bundle))
            }
        } else {
            outcome = BroadcastValidator.broadcastRoute(request).flatMap { bundle in
                if let rejection = refusal(request, bundle: bundle, now: now) {
                    return .failure(rejection)
                }
                return BroadcastValidator.broadcast(request, bundle: bundle, book: book,
                                                    enabled: simulator.broadcastEnabled(bundle))
                    .flatMap { broadcast in
                        if let rejection = simulator.ruleBook.decide(channelID: broadcast.channelID, now: now) {
                            return .failure(rejection)
                        }
                        answer.broadcast = broadcast
                        return .success((200, [], nil))
                    }
            }
        }
        switch outcome {
        case .success(let success):
            answer.status = success.status
            answer.headers = success.headers
            answer.body = success.body
        case .failure(let rejection):
            answer.status = rejection.status
            answer.rejection = rejection
        }
        return answer
    }

    /// Checks the provider token and returns it (the first good one raises the stream limit, as APNs does).
    private func authenticate(_ request: IncomingRequest, now: Double) -> Result<VerifiedToken, APNsRejection> {
        switch simulator.verifier.verify(authorization: request.header("authorization"), now: now) {
        case .failure(let rejection):
            return .failure(rejection)
        case .success(let verified):
            if let rejection = tokens.refusal(of: verified) { return .failure(rejection) }
            if !concurrencyRaised {
                concurrencyRaised = true
                submitSettings(maxConcurrentStreams: simulator.configuration.maxConcurrentStreams)
            }
            return .success(verified)
        }
    }

    /// Duplicate headers, a bad provider token, or one of a team that does not own `bundle` (403 TopicMismatch),
    /// checked before a channel request's own rules.
    private func refusal(_ request: IncomingRequest, bundle: String, now: Double) -> APNsRejection? {
        if let rejection = RequestValidator.duplicates(request) { return rejection }
        switch authenticate(request, now: now) {
        case .failure(let rejection): return rejection
        case .success(let provider):
            return simulator.configuration.team(provider.teamID, owns: bundle) ? nil : APNsRejection(403, "TopicMismatch")
        }
    }

    private func evaluate(_ request: IncomingRequest, now: Double) -> Result<AcceptedPush, APNsRejection> {
        let token: String
        switch RequestValidator.route(request) {
        case .failure(let rejection): return .failure(rejection)
        case .success(let value): token = value
        }
        if let rejection = RequestValidator.duplicates(request) { return .failure(rejection) }
        let provider: VerifiedToken
        switch authenticate(request, now: now) {
        case .failure(let rejection): return .failure(rejection)
        case .success(let value): provider = value
        }
        let configuration = simulator.configuration
        return RequestValidator.notification(request, token: token,
                                             mayUse: { configuration.team(provider.teamID, mayUse: $0) },
                                             isListed: { configuration.allowedTopics.contains($0) })
            .flatMap { push in
                guard simulator.tokenTopics.bind(push.token, to: push.topic) else {
                    return .failure(APNsRejection(400, "DeviceTokenNotForTopic"))
                }
                var push = push
                push.providerTokenIssuedAt = provider.issuedAt
                return .success(push)
            }
    }

    private func send(_ answer: Answer) {
        // The client may have reset the stream while a delayed answer waited: nothing was delivered then.
        guard streams[answer.streamID] != nil else {
            logger.debug("stream closed before its answer", ["sim.stream": "\(answer.streamID)"])
            return
        }
        let now = Date().timeIntervalSince1970
        var headers: [(String, String)] = [(":status", String(answer.status)),
                                           (answer.isChannelRequest ? "apns-request-id" : "apns-id", answer.apnsID)]
        if simulator.configuration.development { headers.append(("apns-unique-id", RequestValidator.newAPNsID())) }
        headers += answer.headers
        var body = answer.body
        if body != nil {
            headers.append(("content-type", "application/json"))
            headers.append(("content-length", String(body!.count)))
        }
        if let rejection = answer.rejection {
            body = rejection.body
            headers.append(("content-type", "application/json"))
            headers.append(("content-length", String(body!.count)))
            simulator.countRejected(rejection)
            simulator.rejectedRecorder?.append(RecordLine.rejected(answer.request, rejection: rejection,
                                                                    apnsID: answer.apnsID, time: now, connection: id))
            logger.debug("rejected", ["apns.status": "\(rejection.status)", "apns.reason": rejection.reason,
                                      "apns.id": answer.apnsID])
        } else if let broadcast = answer.broadcast {
            simulator.countAccepted()
            simulator.channels.countBroadcast(reaching: broadcast.subscribers)
            simulator.broadcastRecorder?.append(BroadcastValidator.recordLine(broadcast, requestID: answer.apnsID,
                                                                              time: now, connection: id))
        } else if let push = answer.push {
            simulator.countAccepted()
            if simulator.recorder != nil {
                RecordLine.appendAccepted(push, apnsID: answer.apnsID, time: now, connection: id, to: &pendingRecords)
            }
        }
        if let body { streams[answer.streamID]!.response = body }
        submitResponse(answer.streamID, headers: headers, hasBody: body != nil)
    }

    private func submitResponse(_ streamID: Int32, headers: [(String, String)], hasBody: Bool) {
        var storage: [UInt8] = []
        for (name, value) in headers {
            storage.append(contentsOf: name.utf8)
            storage.append(contentsOf: value.utf8)
        }
        storage.withUnsafeMutableBufferPointer { base in
            var cursor = 0
            var fields: [nghttp2_nv] = []
            fields.reserveCapacity(headers.count)
            for (name, value) in headers {
                let nameStart = base.baseAddress! + cursor
                cursor += name.utf8.count
                let valueStart = base.baseAddress! + cursor
                cursor += value.utf8.count
                // Every answer carries a new apns-id: indexing it would only churn both HPACK tables (an insert
                // and an eviction per answer on each side) for a value never sent again.
                let flags = name == "apns-id" || name == "apns-request-id" ? NGHTTP2_NV_FLAG_NO_INDEX : NGHTTP2_NV_FLAG_NONE
                fields.append(nghttp2_nv(name: nameStart, value: valueStart, namelen: name.utf8.count,
                                         valuelen: value.utf8.count, flags: UInt8(flags.rawValue)))
            }
            if hasBody {
                var provider = nghttp2_data_provider(source: nghttp2_data_source(ptr: nil), read_callback: simReadBody)
                _ = nghttp2_submit_response(session, streamID, fields, fields.count, &provider)
            } else {
                _ = nghttp2_submit_response(session, streamID, fields, fields.count, nil)
            }
        }
    }

    /// Copies the next part of a stream's response body into nghttp2's buffer.
    func readBody(_ streamID: Int32, into buffer: UnsafeMutablePointer<UInt8>, length: Int,
                  flags: UnsafeMutablePointer<UInt32>) -> Int {
        guard var state = streams[streamID] else { return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue) }
        let count = min(length, state.response.count - state.responseOffset)
        state.response.withUnsafeBufferPointer { source in
            buffer.update(from: source.baseAddress! + state.responseOffset, count: count)
        }
        state.responseOffset += count
        if state.responseOffset == state.response.count { flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
        streams[streamID] = state
        return count
    }
}

// MARK: nghttp2 callbacks (capture-less; the connection comes back through user_data)

private func connection(_ userData: UnsafeMutableRawPointer?) -> SimulatorConnection {
    Unmanaged<SimulatorConnection>.fromOpaque(userData!).takeUnretainedValue()
}

private func simOnBeginHeaders(_ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?,
                               _ userData: UnsafeMutableRawPointer?) -> Int32 {
    guard let frame, frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue),
          frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST else { return 0 }
    connection(userData).streams[frame.pointee.hd.stream_id] = SimulatorConnection.StreamState()
    return 0
}

private func simOnHeader(_ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?,
                         _ name: UnsafePointer<UInt8>?, _ nameLength: Int, _ value: UnsafePointer<UInt8>?,
                         _ valueLength: Int, _ flags: UInt8, _ userData: UnsafeMutableRawPointer?) -> Int32 {
    guard let frame, let name, let value else { return 0 }
    let target = connection(userData)
    let streamID = frame.pointee.hd.stream_id
    guard target.streams[streamID] != nil else { return 0 }
    let nameText = String(decoding: UnsafeBufferPointer(start: name, count: nameLength), as: UTF8.self)
    let valueText = String(decoding: UnsafeBufferPointer(start: value, count: valueLength), as: UTF8.self)
    switch nameText {
    case ":method": target.streams[streamID]!.request.method = valueText
    case ":path": target.streams[streamID]!.request.path = valueText
    case ":scheme", ":authority": break
    default: target.streams[streamID]!.request.headers.append((nameText, valueText))
    }
    return 0
}

private func simOnDataChunk(_ session: OpaquePointer?, _ flags: UInt8, _ streamID: Int32,
                            _ data: UnsafePointer<UInt8>?, _ length: Int, _ userData: UnsafeMutableRawPointer?) -> Int32 {
    guard let data else { return 0 }
    let target = connection(userData)
    guard target.streams[streamID] != nil else { return 0 }
    target.streams[streamID]!.request.bodyLength += length
    let room = RequestValidator.maximumBodyBytes + 1 - target.streams[streamID]!.request.body.count
    if room > 0 {
        target.streams[streamID]!.request.body.append(contentsOf: UnsafeBufferPointer(start: data, count: min(room, length)))
    }
    return 0
}

private func simOnFrame(_ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?,
                        _ userData: UnsafeMutableRawPointer?) -> Int32 {
    guard let frame else { return 0 }
    let type = frame.pointee.hd.type
    guard type == UInt8(NGHTTP2_HEADERS.rawValue) || type == UInt8(NGHTTP2_DATA.rawValue),
          frame.pointee.hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0 else { return 0 }
    connection(userData).requestComplete(frame.pointee.hd.stream_id)
    return 0
}

private func simOnStreamClose(_ session: OpaquePointer?, _ streamID: Int32, _ errorCode: UInt32,
                              _ userData: UnsafeMutableRawPointer?) -> Int32 {
    connection(userData).streams[streamID] = nil
    return 0
}

private func simReadBody(_ session: OpaquePointer?, _ streamID: Int32, _ buffer: UnsafeMutablePointer<UInt8>?,
                         _ length: Int, _ flags: UnsafeMutablePointer<UInt32>?,
                         _ source: UnsafeMutablePointer<nghttp2_data_source>?,
                         _ userData: UnsafeMutableRawPointer?) -> Int {
    guard let buffer, let flags else { return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue) }
    return connection(userData).readBody(streamID, into: buffer, length: length, flags: flags)
}
