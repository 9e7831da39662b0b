// Over 400 lines: one connection's request cycle (read, parse, body, park, respond, keep-alive) kept together so its states read as one.
internal import CHeraldShims
import Foundation
import HeraldRuntime

/// One accepted connection: its socket, read buffer, pending output and where it is in the request cycle.
///
/// Owned by its loop and touched only on that loop's thread. The socket is registered once, edge-triggered, for
/// reading and writing: the steady state needs no epoll_ctl, and since an edge comes with every arrival of bytes,
/// a short read means the socket is drained (no extra recv that would return EAGAIN).
final class HTTPConnection {
    enum Phase {
        /// Waiting for (or reading) a request line and headers.
        case head
        /// Reading the body of `request`.
        case body
        /// The handler of `request` runs; nothing more is read until its response is out (pipelining in order).
        case handling
        /// The response is being written.
        case writing
        /// Answered with an error and shut for writing: reading and dropping what the client still sends, so
        /// closing does not reset the connection before the client has read the answer.
        case lingering(until: ContinuousClock.Instant)
        case closed
    }

    let fd: Int32
    /// The peer's IP address.
    let address: String?
    /// `address` counts against the per-address limit (released on close).
    let countedAddress: Bool
    var phase = Phase.head
    /// The request being read, handled or answered.
    var request: RequestContext?
    var keepAlive = true
    var minorVersion = 1
    /// The framing of the body being read.
    var declaredLength = 0
    var chunked: ChunkedBodyDecoder?
    /// The head of the request whose body is being read.
    var head: HTTPRequestHead?
    /// How far the head being received has been parsed (reset when it completes or fails).
    var headScan = HTTPRequestParser.HeadScan()

    /// Read buffer: bytes `start..<end` are received and not yet parsed.
    private(set) var buffer: UnsafeMutableRawPointer
    private(set) var capacity: Int
    var start = 0
    var end = 0
    /// Edge-triggered: the socket may hold bytes not yet read (an edge came and no short read since).
    var readable = true
    /// Took its steps for this turn of the loop: it goes on in the next, whatever edges or answers come meanwhile.
    var driveQueued = false
    /// The peer shut down its sending side (reported with the edge of its last bytes).
    var peerClosed = false
    var output: [UInt8] = []
    var outputOffset = 0
    /// Close (or linger) once the output is written.
    var closeAfterWrite = false
    /// Answered with a failure: the stream may be out of step, so linger before closing.
    var lingerAfterWrite = false
    /// When the current request (or the next one, while idle) must be in; nil while it is handled or answered.
    var readDeadline: ContinuousClock.Instant?
    /// The last time bytes moved either way.
    var lastActivity: ContinuousClock.Instant

    static let initialCapacity = 4096
    /// The largest output buffer kept between responses.
    static let keptOutputCapacity = 16 * 1024

    init(fd: Int32, address: String?, countedAddress: Bool, now: ContinuousClock.Instant,
         readDeadline: ContinuousClock.Instant) {
        self.fd = fd
        self.address = address
        self.countedAddress = countedAddress
        lastActivity = now
        self.readDeadline = readDeadline
        capacity = Self.initialCapacity
        buffer = .allocate(byteCount: capacity, alignment: 16)
    }

    deinit { buffer.deallocate() }

    var buffered: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: buffer + start, count: end - start) }

    /// Between requests with nothing buffered: closed at once by the drain.
    var isIdle: Bool {
        if case .head = phase { return request == nil && start == end }
        return false
    }

    func isOverdue(now: ContinuousClock.Instant, idleTimeout: Duration) -> Bool {
        switch phase {
        case .head, .body:
            if let readDeadline, readDeadline <= now { return true }
            return now - lastActivity >= idleTimeout
        case .writing:
            return now - lastActivity >= idleTimeout
        case .lingering(let until):
            return until <= now
        case .handling, .closed:
            return false
        }
    }

    /// Makes room for at least `wanted` more bytes at `end` without the buffer growing past `maximum`: moves the
    /// unparsed bytes to the front, then doubles. False when there is no room at all.
    func reserve(_ wanted: Int, maximum: Int) -> Bool {
        if start == end { start = 0; end = 0 }
        if capacity - end >= wanted { return true }
        if start > 0 {
            (buffer).copyMemory(from: buffer + start, byteCount: end - start)
            end -= start
            start = 0
            if capacity - end >= wanted { return true }
        }
        guard capacity < maximum else { return capacity > end }
        let grown = min(maximum, max(capacity * 2, end + wanted))
        let larger = UnsafeMutableRawPointer.allocate(byteCount: grown, alignment: 16)
        larger.copyMemory(from: buffer, byteCount: end)
        buffer.deallocate()
        buffer = larger
        capacity = grown
        return true
    }

    /// Back to a small buffer between requests after a large one.
    func shrinkIfIdle() {
        guard start == end, capacity > 4 * Self.initialCapacity else { return }
        buffer.deallocate()
        capacity = Self.initialCapacity
        buffer = .allocate(byteCount: capacity, alignment: 16)
        start = 0
        end = 0
    }
}

/// The request cycle of the loop's connections: read, parse, route, park, respond, keep alive or close.
extension WorkerLoop {
    /// The request line and headers must fit in this many bytes (else 431).
    static let headerLimit = 16 * 1024
    /// After the limit is crossed a chunked body is read on and dropped, so the 413 can be sent on a connection
    /// still in step; past this many further bytes the answer is 413 and a close.
    static let discardAllowance = 1 << 20
    /// A body of declared length is read into room made this many bytes at a time (the buffer doubles as needed).
    static let bodyReadStep = 16 * 1024
    /// How long an answered-and-closing connection keeps reading what the client still sends.
    static let lingerTime: Duration = .seconds(2)

    private var bufferLimit: Int { Self.headerLimit + engine.maxBodyBytes }

    func connectionReady(_ connection: HTTPConnection, events: DescriptorEvents) {
        if events.contains(.readable) || events.contains(.failed) { connection.readable = true }
        if events.contains(.peerClosed) { connection.peerClosed = true }
        if events.contains(.writable), !connection.output.isEmpty {
            flush(connection)
        }
        drive(connection)
    }

    /// Steps one connection takes per turn of its loop (each a head parsed, a body complete or an answer queued).
    static let stepsPerTurn = 64

    /// Parses and reads until the connection waits: for bytes, for its handler, or for the socket to drain. A client
    /// pipelining requests as fast as they are answered would keep it going for ever: after `stepsPerTurn` it goes
    /// on in the loop's next turn, after the other connections.
    func drive(_ connection: HTTPConnection) {
        guard !connection.driveQueued else { return }
        var steps = 0
        while true {
            switch connection.phase {
            case .head, .body:
                if step(connection) {
                    steps += 1
                    guard steps < Self.stepsPerTurn else {
                        connection.driveQueued = true
                        let (fd, identity) = (connection.fd, ObjectIdentifier(connection))
                        perform { [self] in
                            // Not a connection accepted since on the same descriptor.
                            guard let connection = connections[fd], ObjectIdentifier(connection) == identity else { return }
                            connection.driveQueued = false
                            drive(connection)
                        }
                        return
                    }
                    continue
                }
                guard connection.readable, receive(connection) else { return }
            case .lingering:
                discardInput(connection)
                return
            case .handling, .writing, .closed:
                return
            }
        }
    }

    /// Reads into the buffer. True when bytes came; false when the socket is drained or the connection closed.
    private func receive(_ connection: HTTPConnection) -> Bool {
        let wanted: Int
        if case .body = connection.phase, connection.chunked == nil {
            // Room for what has come, a step at a time: a declared length costs memory only as its bytes arrive.
            wanted = min(Self.bodyReadStep, max(1, connection.declaredLength - (connection.end - connection.start)))
        } else {
            wanted = 1
        }
        guard connection.reserve(min(wanted, bufferLimit), maximum: bufferLimit) else {
            // Full and nothing parsable: cannot happen within the limits the parser enforces; close to be safe.
            closeConnection(connection)
            return false
        }
        let space = connection.capacity - connection.end
        let count = recv(connection.fd, connection.buffer + connection.end, space, 0)
        if count > 0 {
            connection.end += count
            connection.lastActivity = now
            // After the peer's FIN no edge comes again: read on until the end of stream closes the connection.
            if count < space, !connection.peerClosed { connection.readable = false }
            return true
        }
        if count < 0, errno == EAGAIN || errno == EWOULDBLOCK {
            connection.readable = false
            return false
        }
        if count < 0, errno == EINTR { return true }
        // End of stream or an error: a request half read is abandoned.
        closeConnection(connection)
        return false
    }

    /// Advances with what is buffered. True when it moved on (a head parsed, a body complete, an answer queued).
    private func step(_ connection: HTTPConnection) -> Bool {
        guard connection.start < connection.end else { return false }
        if case .head = connection.phase {
            switch HTTPRequestParser.parseHead(connection.buffered, limit: Self.headerLimit, resuming: &connection.headScan) {
            case .incomplete:
                return false
            case .failed(let failure):
                connection.headScan = .init()
                connection.start = connection.end
                connection.keepAlive = false
                sendError(failure.error, on: connection, context: nil)
                return true
            case .complete(let head, let length):
                connection.headScan = .init()
                connection.start += length
                begin(head, on: connection)
                return true
            }
        }
        guard let context = connection.request else { return false }
        if var decoder = connection.chunked {
            let (consumed, progress) = decoder.decode(connection.buffered, into: &context.body)
            connection.start += consumed
            connection.chunked = decoder
            context.received = decoder.received
            if decoder.overLimit, !context.tooLarge {
                context.tooLarge = true
                context.body = []
            }
            switch progress {
            case .needMore: return consumed > 0
            case .done: bodyComplete(connection, context)
            case .failed(let failure):
                connection.keepAlive = false
                context.tooLarge = failure.status == 413
                sendError(failure.error, on: connection, context: context)
            }
            return true
        }
        let length = connection.declaredLength
        guard connection.end - connection.start >= length else { return false }
        context.body = Array(UnsafeRawBufferPointer(start: connection.buffer + connection.start, count: length))
        context.received = length
        connection.start += length
        bodyComplete(connection, context)
        return true
    }

    /// Headers in: route now (so even an early refusal carries its route label), refuse bad framing and a declared
    /// length over the limit before reading any body, and say 100 Continue to a client waiting for it.
    private func begin(_ head: HTTPRequestHead, on connection: HTTPConnection) {
        let context = RequestContext(
            loop: self, connection: connection, method: head.method, path: head.path,
            requestID: RequestEngine.requestID(fromHeader: head.headers["X-Request-ID"]),
            match: engine.router.match(method: HTTPMethod(rawValue: head.method), path: head.path))
        engine.requestStarted()
        connection.request = context
        connection.keepAlive = head.keepAlive
        connection.minorVersion = head.minorVersion
        connection.chunked = nil
        connection.declaredLength = 0
        connection.phase = .body
        connection.head = head
        let framing: HTTPBodyFraming
        switch head.framing {
        case .failure(let failure):
            connection.keepAlive = false
            sendError(failure.error, on: connection, context: context)
            return
        case .success(let value):
            framing = value
        }
        switch framing {
        case .none:
            bodyComplete(connection, context)
            return
        case .length(let length):
            if length > engine.maxBodyBytes {
                // Answered before the body is read; the connection then closes instead of reading it.
                context.tooLarge = true
                connection.keepAlive = false
                sendError(HTTPError.bodyTooLarge(limit: engine.maxBodyBytes), on: connection, context: context)
                return
            }
            connection.declaredLength = length
            if head.expectsContinue, connection.end - connection.start < length { sendContinue(connection) }
        case .chunked:
            // Framing may be as long as the body itself (small chunks of a streaming encoder) plus trailers.
            connection.chunked = ChunkedBodyDecoder(limit: engine.maxBodyBytes, discardAllowance: Self.discardAllowance,
                                                    framingLimit: Self.headerLimit + engine.maxBodyBytes)
            if head.expectsContinue, connection.start == connection.end { sendContinue(connection) }
        }
    }

    /// The body is in: answer at once (413, 404, 405, 415) or park the request while its handler runs.
    private func bodyComplete(_ connection: HTTPConnection, _ context: RequestContext) {
        connection.readDeadline = nil
        guard let head = connection.head else { return }
        connection.head = nil
        if context.tooLarge {
            send(HTTPError.bodyTooLarge(limit: engine.maxBodyBytes).response, on: connection, context: context)
            return
        }
        switch context.match {
        case .notFound:
            send(HTTPError.notFound().response, on: connection, context: context)
        case .methodNotAllowed(_, let allowed):
            send(HTTPError.methodNotAllowed(allowed: allowed).response, on: connection, context: context)
        case .found(let route, let parameters):
            if route.body == .json, !RequestEngine.isJSON(contentType: head.headers["Content-Type"]) {
                send(HTTPError.unsupportedMediaType.response, on: connection, context: context)
                return
            }
            let query = head.query.map { HTTPRequest.query(arguments: HTTPRequestParser.arguments(ofQuery: $0)) } ?? [:]
            let request = HTTPRequest(
                method: HTTPMethod(rawValue: context.method), path: context.path, route: route.pattern,
                pathParameters: parameters, query: query, headers: head.headers, body: context.body,
                requestID: context.requestID, remoteAddress: connection.address)
            context.body = []
            connection.phase = .handling
            if !parked.park(context, request: request, handler: route.handler) {
                send(HTTPError.unavailable("the server is shutting down").response, on: connection, context: context)
            }
        }
    }

    /// A parked request's answer (from its handler, the deadline sweep or shutdown).
    func respond(_ response: HTTPResponse, for context: RequestContext) {
        let connection = context.connection
        // The connection closed meanwhile (or the loop stopped): the request was recorded as aborted then.
        guard connection.request === context, case .handling = connection.phase else { return }
        send(response, on: connection, context: context)
        drive(connection)
    }

    // MARK: Writing

    private func sendError(_ error: HTTPError, on connection: HTTPConnection, context: RequestContext?) {
        connection.lingerAfterWrite = true
        send(error.response, on: connection, context: context)
    }

    private func sendContinue(_ connection: HTTPConnection) {
        connection.output.append(contentsOf: "HTTP/1.1 100 Continue\r\n\r\n".utf8)
        flush(connection)
    }

    /// Serialises the response into one buffer and writes it; the rest waits for the socket to drain.
    private func send(_ response: HTTPResponse, on connection: HTTPConnection, context: RequestContext?) {
        var response = response
        if !(100...999).contains(response.status) {
            engine.logger.error("handler answered an invalid status", ["http.route": context?.routeLabel ?? "",
                                                                       "http.status": "\(response.status)"])
            response = HTTPError.internalError.response
        }
        let close = !connection.keepAlive || engine.draining || connection.lingerAfterWrite
        connection.closeAfterWrite = close
        connection.readDeadline = nil
        let requestID = context?.requestID ?? RequestEngine.requestID(fromHeader: nil)
        let headOnly = context?.headOnly ?? false
        refreshDate()
        ResponseWriter.serialize(response, requestID: requestID, close: close,
                                 keepAliveHeader: connection.minorVersion == 0 && !close, headOnly: headOnly,
                                 dateLine: dateLine, into: &connection.output)
        context?.status = response.status
        context?.bytesOut = response.body.count
        connection.phase = .writing
        flush(connection)
    }

    /// Writes pending output; when a response is all out, finishes its request and moves on.
    func flush(_ connection: HTTPConnection) {
        while connection.outputOffset < connection.output.count {
            let written = connection.output.withUnsafeBytes { bytes in
                Foundation.send(connection.fd, bytes.baseAddress! + connection.outputOffset,
                                bytes.count - connection.outputOffset, Int32(MSG_NOSIGNAL))
            }
            if written > 0 {
                connection.outputOffset += written
                connection.lastActivity = now
                continue
            }
            if written < 0, errno == EINTR { continue }
            if written < 0, errno == EAGAIN || errno == EWOULDBLOCK { return }  // the EPOLLOUT edge resumes it
            closeConnection(connection)
            return
        }
        // The buffer is kept for the connection's next response (one allocation less per request), unless a large
        // response grew it.
        if connection.output.capacity > HTTPConnection.keptOutputCapacity {
            connection.output = []
        } else {
            connection.output.removeAll(keepingCapacity: true)
        }
        connection.outputOffset = 0
        guard case .writing = connection.phase else { return }  // a 100 Continue: the body is still to come
        finishRequest(connection, completed: true)
        if connection.closeAfterWrite {
            if connection.lingerAfterWrite || connection.start < connection.end {
                shutdown(connection.fd, Int32(SHUT_WR))
                connection.phase = .lingering(until: now + Self.lingerTime)
            } else {
                closeConnection(connection)
            }
            return
        }
        connection.phase = .head
        connection.readDeadline = now + readTimeout
        connection.shrinkIfIdle()
    }

    /// Reads and drops what a closing client still sends; closes at its end of stream.
    private func discardInput(_ connection: HTTPConnection) {
        while connection.readable {
            // Into the read buffer, which holds nothing needed any more.
            let count = recv(connection.fd, connection.buffer, connection.capacity, 0)
            if count > 0 { continue }
            if count < 0, errno == EAGAIN || errno == EWOULDBLOCK {
                connection.readable = false
                return
            }
            if count < 0, errno == EINTR { continue }
            closeConnection(connection)
            return
        }
    }

    // MARK: Ending

    private func finishRequest(_ connection: HTTPConnection, completed: Bool) {
        guard let context = connection.request else { return }
        connection.request = nil
        let route = context.routeLabel
        let methodLabel = HTTPMethod(rawValue: context.method).metricLabel
        let series = context.status > 0 ? series(route: route, methodLabel: methodLabel, status: context.status) : nil
        engine.requestFinished(methodLabel: methodLabel, route: route, status: context.status, series: series,
                               started: context.started, requestID: context.requestID, bytesIn: context.received,
                               bytesOut: context.bytesOut, completed: completed)
    }

    /// The metric series for a finished request, from this loop's own table (no lock): the families are asked
    /// only the first time a loop sees a route, method and status.
    private func series(route: String, methodLabel: String, status: Int) -> RequestEngine.Series {
        let key = SeriesKey(route: route, methodLabel: methodLabel, status: status)
        if let known = seriesCache[key] { return known }
        let found = engine.series(route: route, methodLabel: methodLabel, status: status)
        seriesCache[key] = found
        return found
    }

    /// Closes the socket (which also leaves the epoll set); a request still open is recorded as aborted.
    func closeConnection(_ connection: HTTPConnection) {
        if case .closed = connection.phase { return }
        finishRequest(connection, completed: false)
        connection.phase = .closed
        connection.output = []
        close(connection.fd)
        connections[connection.fd] = nil
        if connection.countedAddress, let address = connection.address { addresses.release(address) }
        resumeAccepting()
    }

    private func refreshDate() {
        guard time(nil) != dateSecond else { return }
        var text = [CChar](repeating: 0, count: 40)
        dateSecond = herald_http_date(&text, text.count)
        dateLine = Array("Date: ".utf8) + text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) } + [13, 10]
    }
}
