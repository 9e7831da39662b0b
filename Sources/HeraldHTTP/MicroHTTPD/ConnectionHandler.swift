internal import CHeraldShims
internal import CMicroHTTPD
import HeraldRuntime
import Foundation
import Synchronization

/// libmicrohttpd's callbacks for one daemon: reads requests, parks them (suspends the connection) while their
/// async handler runs, and queues the response when the handler resumes the connection.
///
/// The protocol per request: first access-handler call (headers in) → context created and routed; calls with
/// upload data → body accumulated up to the limit; call with no data (body complete) → answered at once (404, 405,
/// 413, 415) or parked; the handler task stores its response and resumes the connection; the next call queues it.
/// Answering on the second or later call keeps the connection alive (answering on the first forces a close).
final class ConnectionHandler: Sendable {
    /// After the limit is crossed a chunked body is read on and dropped, so the 413 can be sent on a connection
    /// still in step; past this many further bytes the connection is simply closed.
    static let discardAllowance = 1 << 20

    let engine: RequestEngine
    /// Parked requests, spread over shards so the worker threads and handler tasks rarely meet on one lock.
    private let shards: [ShardLock]
    /// Set once shutdown has answered every parked request; a handler finishing later must not touch its
    /// connection, which the daemon may have closed.
    private let stopped = Atomic<Bool>(false)
    /// Handler tasks between deciding to resume their connection and having done so; `stop` waits for zero.
    private let resuming = Atomic<Int>(0)

    init(engine: RequestEngine) {
        self.engine = engine
        shards = (0..<16).map { _ in ShardLock() }
    }

    /// Requests whose handler is running, by context; `closed` once shutdown has answered them all.
    struct Shard {
        var entries: [ObjectIdentifier: (context: RequestContext, deadline: ContinuousClock.Instant)] = [:]
        var closed = false
    }

    final class ShardLock: Sendable {
        let state = Lock(Shard())
    }

    private func shard(_ context: RequestContext) -> ShardLock {
        shards[Int(UInt(bitPattern: ObjectIdentifier(context).hashValue) % UInt(shards.count))]
    }

    // MARK: Access handler

    func access(_ connection: OpaquePointer, url: UnsafePointer<CChar>, method: UnsafePointer<CChar>,
                uploadData: UnsafePointer<CChar>?, uploadSize: UnsafeMutablePointer<Int>,
                slot: UnsafeMutablePointer<UnsafeMutableRawPointer?>, executor: any TaskExecutor) -> MHD_Result {
        guard let raw = slot.pointee else {
            return begin(connection, url: url, method: method, slot: slot)
        }
        let context = Unmanaged<RequestContext>.fromOpaque(raw).takeUnretainedValue()

        if uploadSize.pointee > 0 {
            let count = uploadSize.pointee
            uploadSize.pointee = 0
            context.received += count
            if context.received > engine.maxBodyBytes {
                if !context.tooLarge {
                    context.tooLarge = true
                    context.body = []
                }
                return context.received > engine.maxBodyBytes + Self.discardAllowance ? .NO : .YES
            }
            if let uploadData {
                context.body.append(contentsOf: UnsafeRawBufferPointer(start: uploadData, count: count))
            }
            return .YES
        }

        // The body is complete, or the handler has resumed the connection with its response.
        if let response = context.shared.withLock({ $0.pendingResponse.take() }) {
            return queue(response, for: context)
        }
        if context.tooLarge { return queue(HTTPError.bodyTooLarge(limit: engine.maxBodyBytes).response, for: context) }
        switch context.match {
        case .notFound:
            return queue(HTTPError.notFound().response, for: context)
        case .methodNotAllowed(_, let allowed):
            return queue(HTTPError.methodNotAllowed(allowed: allowed).response, for: context)
        case .found(let route, let parameters):
            let headers = Self.values(connection, kind: .HEADER_KIND)
            if route.body == .json, !RequestEngine.isJSON(contentType: headers["Content-Type"]) {
                return queue(HTTPError.unsupportedMediaType.response, for: context)
            }
            let query = HTTPRequest.query(arguments: Self.values(connection, kind: .GET_ARGUMENT_KIND))
            let request = HTTPRequest(
                method: HTTPMethod(rawValue: context.method), path: context.path, route: route.pattern,
                pathParameters: parameters, query: query, headers: headers, body: context.body,
                requestID: context.requestID, remoteAddress: Self.clientAddress(connection))
            context.body = []
            return park(context, request: request, handler: route.handler, executor: executor)
        }
    }

    /// First call: only the headers are in. Route now (so even an early 413 carries its route label), and refuse
    /// a declared Content-Length over the limit before reading any of the body.
    private func begin(_ connection: OpaquePointer, url: UnsafePointer<CChar>, method: UnsafePointer<CChar>,
                       slot: UnsafeMutablePointer<UnsafeMutableRawPointer?>) -> MHD_Result {
        let methodText = String(cString: method)
        let path = String(cString: url)
        let requestID = RequestEngine.requestID(
            fromHeader: MHD_lookup_connection_value(connection, .HEADER_KIND, "X-Request-ID").map {
                String(cString: $0)
            })
        let context = RequestContext(connection: connection, method: methodText, path: path, requestID: requestID,
                                     match: engine.router.match(method: HTTPMethod(rawValue: methodText), path: path))
        engine.requestStarted()
        slot.pointee = Unmanaged.passRetained(context).toOpaque()

        let declaredLength = MHD_lookup_connection_value(connection, .HEADER_KIND, "Content-Length")
        if declaredLength != nil, MHD_lookup_connection_value(connection, .HEADER_KIND, "Transfer-Encoding") != nil {
            // Both framings: the mark of request smuggling. libmicrohttpd would follow the chunked one and keep the
            // connection; RFC 9112 §6.1 says close it. Answering on this first call closes it.
            return queue(HTTPError.badRequest("ambiguous_length",
                                              "Content-Length and Transfer-Encoding must not both be sent").response,
                         for: context)
        }
        if let declared = declaredLength,
           let length = Int(String(cString: declared)) {
            if length > engine.maxBodyBytes {
                // Answering now makes libmicrohttpd close the connection instead of reading the body.
                context.tooLarge = true
                return queue(HTTPError.bodyTooLarge(limit: engine.maxBodyBytes).response, for: context)
            }
            context.body.reserveCapacity(length)
        }
        return .YES
    }

    // MARK: Parking while the handler runs

    /// Suspends the connection and runs the handler in a task. Checking `closed`, suspending and registering
    /// happen under the shard lock shutdown takes, so every suspended connection is one shutdown can see.
    private func park(_ context: RequestContext, request: HTTPRequest, handler: @escaping HTTPHandler,
                      executor: any TaskExecutor) -> MHD_Result {
        let deadline = ContinuousClock.now + engine.requestDeadline
        let accepted = shard(context).state.withLock { shard -> Bool in
            guard !shard.closed else { return false }
            MHD_suspend_connection(context.connection)
            shard.entries[ObjectIdentifier(context)] = (context, deadline)
            return true
        }
        guard accepted else {
            return queue(HTTPError.unavailable("the server is shutting down").response, for: context)
        }
        let task = Task(executorPreference: executor) { [engine] in
            let response = await engine.respond(to: request, with: handler)
            self.complete(context, with: response)
        }
        context.shared.withLock { $0.handlerTask = task }
        return MHD_Result.YES
    }

    /// Hands a handler's response to its connection, unless the deadline sweep or shutdown answered first.
    ///
    /// `resuming` and `stopped` form a handshake with `stop`: either this task sees `stopped` and leaves the
    /// connection alone (shutdown has answered it), or `stop` sees this task in `resuming` and waits for it.
    private func complete(_ context: RequestContext, with response: HTTPResponse) {
        resuming.add(1, ordering: .sequentiallyConsistent)
        defer { resuming.subtract(1, ordering: .sequentiallyConsistent) }
        guard !stopped.load(ordering: .sequentiallyConsistent), context.claim() else { return }
        context.shared.withLock { $0.pendingResponse = response }
        MHD_resume_connection(context.connection)
        _ = shard(context).state.withLock { $0.entries.removeValue(forKey: ObjectIdentifier(context)) }
    }

    /// Answers 503 to parked requests past their deadline and cancels their handlers.
    func expireOverdue(now: ContinuousClock.Instant = .now) {
        var expired: [RequestContext] = []
        for shard in shards {
            shard.state.withLock { shard in
                for (key, entry) in shard.entries where entry.deadline <= now {
                    shard.entries[key] = nil
                    if answer(entry.context, with: HTTPError.unavailable("the request took too long")) {
                        expired.append(entry.context)
                    }
                }
            }
        }
        for context in expired { context.shared.withLock { $0.handlerTask }?.cancel() }
        if !expired.isEmpty {
            engine.logger.warning("handlers past the request deadline answered 503", ["http.count": "\(expired.count)"])
        }
    }

    /// Shutdown: answers 503 to every parked request, cancels their handlers, and refuses to park new ones, so
    /// that no connection is left suspended when the daemon stops. Returns how many were answered.
    func failParked() -> Int {
        var answered: [RequestContext] = []
        for shard in shards {
            shard.state.withLock { shard in
                shard.closed = true
                for entry in shard.entries.values
                where answer(entry.context, with: HTTPError.unavailable("the server is shutting down")) {
                    answered.append(entry.context)
                }
                shard.entries = [:]
            }
        }
        for context in answered { context.shared.withLock { $0.handlerTask }?.cancel() }
        return answered.count
    }

    /// Called after `failParked`, just before the daemon stops: from here on handler tasks leave their
    /// connections alone; waits out any task already resuming one.
    func stopResuming() {
        stopped.store(true, ordering: .sequentiallyConsistent)
        while resuming.load(ordering: .sequentiallyConsistent) > 0 { sched_yield() }
    }

    /// Claims a parked request for an error answer and resumes its connection. False if its handler won.
    private func answer(_ context: RequestContext, with error: HTTPError) -> Bool {
        guard context.claim() else { return false }
        context.shared.withLock { $0.pendingResponse = error.response }
        MHD_resume_connection(context.connection)
        return true
    }

    // MARK: Completion

    /// Request-completed callback: releases the context and records the request.
    func completed(_ slot: UnsafeMutablePointer<UnsafeMutableRawPointer?>, code: MHD_RequestTerminationCode) {
        guard let raw = slot.pointee else { return }
        slot.pointee = nil
        let context = Unmanaged<RequestContext>.fromOpaque(raw).takeRetainedValue()
        engine.requestFinished(method: context.method, route: context.routeLabel, status: context.status,
                               started: context.started, requestID: context.requestID, bytesIn: context.received,
                               bytesOut: context.bytesOut, completed: code == .REQUEST_TERMINATED_COMPLETED_OK)
    }

    // MARK: Responses

    private func queue(_ response: HTTPResponse, for context: RequestContext) -> MHD_Result {
        var response = response
        if !(100...999).contains(response.status) {
            engine.logger.error("handler answered an invalid status", ["http.route": context.routeLabel,
                                                                       "http.status": "\(response.status)"])
            response = HTTPError.internalError.response
        }
        let created = response.body.withUnsafeBytes { bytes in
            MHD_create_response_from_buffer(bytes.count, UnsafeMutableRawPointer(mutating: bytes.baseAddress),
                                            .RESPMEM_MUST_COPY)
        }
        guard let handle = created else { return .NO }
        defer { MHD_destroy_response(handle) }
        for (name, value) in response.headers where !HTTPHeaders.sameName(name, "Content-Length") {
            MHD_add_response_header(handle, name, value)
        }
        MHD_add_response_header(handle, "X-Request-ID", context.requestID)
        if engine.draining { MHD_add_response_header(handle, "Connection", "close") }
        context.status = response.status
        context.bytesOut = response.body.count
        return MHD_queue_response(context.connection, UInt32(response.status), handle)
    }

    // MARK: Reading the request

    private static func values(_ connection: OpaquePointer, kind: MHD_ValueKind) -> HTTPHeaders {
        var headers = HTTPHeaders()
        withUnsafeMutablePointer(to: &headers) { pointer in
            _ = MHD_get_connection_values(connection, kind, { cls, _, key, value in
                guard let cls, let key else { return .YES }
                let headers = cls.assumingMemoryBound(to: HTTPHeaders.self)
                headers.pointee.add(String(cString: key), value.map { String(cString: $0) } ?? "")
                return .YES
            }, pointer)
        }
        return headers
    }

    static func clientAddress(_ connection: OpaquePointer) -> String? {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: 64) { buffer in
            guard herald_mhd_client_address(connection, buffer.baseAddress, buffer.count) == 0 else { return nil }
            return String(cString: buffer.baseAddress!)
        }
    }
}
