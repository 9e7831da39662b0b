import Foundation
internal import CNghttp2

/// What an HTTP/2 client session reports as frames arrive. Called on the loop thread from inside
/// `receive(_:)`: implementations record what happened and act on it once `receive` has returned (the session must
/// not be deleted inside its own callback).
protocol HTTP2SessionEvents: AnyObject {
    /// The server's SETTINGS (not an acknowledgement), with its SETTINGS_MAX_CONCURRENT_STREAMS.
    func settingsReceived(maximumConcurrentStreams: Int)
    func pingAcknowledged()
    func goawayReceived(lastStreamID: Int32, errorCode: UInt32, reason: String)
    /// The last frame of a response arrived (END_STREAM on HEADERS or DATA).
    func responseEnded(_ request: PendingRequest)
    func headerReceived(_ request: PendingRequest, name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>)
    func dataReceived(_ request: PendingRequest, data: UnsafeBufferPointer<UInt8>)
    func streamClosed(_ streamID: Int32, _ ending: HTTP2StreamEnding)
}

/// How a stream ended.
enum HTTP2StreamEnding: Equatable {
    case noError
    /// REFUSED_STREAM: the server did not process it.
    case refused
    /// Another error code, in nghttp2's words.
    case error(String)
}

/// An nghttp2 client session: frames in and out as bytes, requests as streams whose user data is the
/// `PendingRequest` (unretained: the connection keeps it alive until its stream closes or the session is gone).
final class HTTP2ClientSession {
    private let session: OpaquePointer
    /// The events' receiver. Not counted: the connection owns this session and outlives it, and a checked
    /// reference cost a retain and a release on every header of every answer.
    fileprivate unowned(unsafe) let events: any HTTP2SessionEvents

    /// A session that sends its SETTINGS (no server push) first; nil when nghttp2 cannot create one.
    init?(events: any HTTP2SessionEvents) {
        var callbacks: OpaquePointer?
        nghttp2_session_callbacks_new(&callbacks)
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, onFrameReceived)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, onHeader)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, onDataChunk)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, onStreamClose)
        self.events = events
        var session: OpaquePointer?
        // No callback runs before the first `receive`, by which time the user data is this object (unretained:
        // it outlives its nghttp2 session).
        guard nghttp2_session_client_new(&session, callbacks, nil) == 0, let session else { return nil }
        self.session = session
        nghttp2_session_set_user_data(session, Unmanaged.passUnretained(self).toOpaque())
        var settings = [nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0)]
        nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count)
    }

    deinit { nghttp2_session_del(session) }

    /// Feeds received bytes; the error text when they break the protocol.
    func receive(_ bytes: UnsafeBufferPointer<UInt8>) -> String? {
        let consumed = nghttp2_session_mem_recv(session, bytes.baseAddress, bytes.count)
        return consumed < 0 ? String(cString: nghttp2_strerror(Int32(consumed))) : nil
    }

    /// Appends queued frames to `outgoing` until it holds `limit` bytes or nothing is queued; the error text when
    /// nghttp2 fails.
    func takeOutgoing(into outgoing: inout [UInt8], limit: Int) -> String? {
        while outgoing.count < limit {
            var data: UnsafePointer<UInt8>?
            let length = nghttp2_session_mem_send(session, &data)
            if length < 0 { return String(cString: nghttp2_strerror(Int32(length))) }
            guard length > 0, let data else { break }
            outgoing.append(contentsOf: UnsafeBufferPointer(start: data, count: length))
        }
        return nil
    }

    /// nghttp2 wants neither to read nor to write: the connection is to be dropped. After a GOAWAY either way with
    /// no stream left open, or once nghttp2 has sent its own GOAWAY for a protocol error in what it received (it
    /// ignores all input from then on).
    var isFinished: Bool { nghttp2_session_want_read(session) == 0 && nghttp2_session_want_write(session) == 0 }

    /// Opens a stream for `request` (its headers and body); the stream id, or nghttp2's refusal.
    func submit(_ request: PendingRequest) -> Result<Int32, HTTP2SubmitError> {
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
                // No body (a channel read, list or delete): END_STREAM rides the HEADERS frame.
                guard !request.body.isEmpty else {
                    return nghttp2_submit_request(session, nil, nameValues.baseAddress, fields.count, nil, context)
                }
                var provider = nghttp2_data_provider()
                provider.read_callback = readBodyCallback
                return nghttp2_submit_request(session, nil, nameValues.baseAddress, fields.count, &provider, context)
            }
        }
        return streamID > 0 ? .success(streamID) : .failure(HTTP2SubmitError(message: String(cString: nghttp2_strerror(streamID))))
    }

    /// Stream ids are 31 bits: the next one this session would use.
    var nextStreamID: UInt32 { nghttp2_session_get_next_stream_id(session) }

    func cancel(stream: Int32) {
        nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), stream, NGHTTP2_CANCEL.rawValue)
    }

    func ping() {
        nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil)
    }

    /// Queues GOAWAY (NO_ERROR).
    func terminate() {
        nghttp2_session_terminate_session(session, NGHTTP2_NO_ERROR.rawValue)
    }

    /// Runs `body` with the stream's request, borrowed (the connection keeps it alive while its stream is open).
    fileprivate func withRequest<Result>(_ stream: Int32, _ body: (PendingRequest) -> Result) -> Result? {
        guard let context = nghttp2_session_get_stream_user_data(session, stream) else { return nil }
        return Unmanaged<PendingRequest>.fromOpaque(context)._withUnsafeGuaranteedRef(body)
    }

    fileprivate func frameReceived(_ frame: UnsafePointer<nghttp2_frame>) {
        let header = frame.pointee.hd
        let isAck = header.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) != 0
        switch UInt32(header.type) {
        case NGHTTP2_SETTINGS.rawValue where !isAck:
            let maximum = nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)
            events.settingsReceived(maximumConcurrentStreams: Int(min(maximum, UInt32(Int32.max))))
        case NGHTTP2_PING.rawValue where isAck:
            events.pingAcknowledged()
        case NGHTTP2_GOAWAY.rawValue:
            let goaway = frame.pointee.goaway
            var reason = ""
            if let data = goaway.opaque_data, goaway.opaque_data_len > 0 {
                reason = String(decoding: UnsafeBufferPointer(start: data, count: goaway.opaque_data_len), as: UTF8.self)
            }
            events.goawayReceived(lastStreamID: goaway.last_stream_id, errorCode: goaway.error_code, reason: reason)
        case NGHTTP2_HEADERS.rawValue, NGHTTP2_DATA.rawValue:
            if header.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0 {
                withRequest(header.stream_id) { events.responseEnded($0) }
            }
        default:
            break
        }
    }

    fileprivate func streamClosed(_ stream: Int32, errorCode: UInt32) {
        let ending: HTTP2StreamEnding = switch errorCode {
        case NGHTTP2_NO_ERROR.rawValue: .noError
        case NGHTTP2_REFUSED_STREAM.rawValue: .refused
        default: .error(String(cString: nghttp2_http2_strerror(errorCode)))
        }
        events.streamClosed(stream, ending)
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

/// nghttp2 refused to open a stream.
struct HTTP2SubmitError: Error {
    let message: String
}

// Capture-less nghttp2 callbacks: the session's user data is the HTTP2ClientSession.

/// The session, borrowed for the callback (it outlives its nghttp2 session): no retain and release per call.
private func withClientSession<Result>(_ context: UnsafeMutableRawPointer?,
                                       _ body: (HTTP2ClientSession) -> Result) -> Result {
    Unmanaged<HTTP2ClientSession>.fromOpaque(context!)._withUnsafeGuaranteedRef(body)
}

private func onFrameReceived(_ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?,
                             _ context: UnsafeMutableRawPointer?) -> Int32 {
    if let frame { withClientSession(context) { $0.frameReceived(frame) } }
    return 0
}

private func onHeader(_ session: OpaquePointer?, _ frame: UnsafePointer<nghttp2_frame>?, _ name: UnsafePointer<UInt8>?,
                      _ nameLength: Int, _ value: UnsafePointer<UInt8>?, _ valueLength: Int, _ flags: UInt8,
                      _ context: UnsafeMutableRawPointer?) -> Int32 {
    guard let frame, let name, let value else { return 0 }
    withClientSession(context) { owner in
        owner.withRequest(frame.pointee.hd.stream_id) { request in
            owner.events.headerReceived(request, name: UnsafeBufferPointer(start: name, count: nameLength),
                                        value: UnsafeBufferPointer(start: value, count: valueLength))
        }
    }
    return 0
}

private func onDataChunk(_ session: OpaquePointer?, _ flags: UInt8, _ stream: Int32, _ data: UnsafePointer<UInt8>?,
                         _ length: Int, _ context: UnsafeMutableRawPointer?) -> Int32 {
    guard let data else { return 0 }
    withClientSession(context) { owner in
        owner.withRequest(stream) { request in
            owner.events.dataReceived(request, data: UnsafeBufferPointer(start: data, count: length))
        }
    }
    return 0
}

private func onStreamClose(_ session: OpaquePointer?, _ stream: Int32, _ errorCode: UInt32,
                           _ context: UnsafeMutableRawPointer?) -> Int32 {
    withClientSession(context) { $0.streamClosed(stream, errorCode: errorCode) }
    return 0
}

private func readBodyCallback(_ session: OpaquePointer?, _ stream: Int32, _ buffer: UnsafeMutablePointer<UInt8>?, _ length: Int,
                              _ flags: UnsafeMutablePointer<UInt32>?, _ source: UnsafeMutablePointer<nghttp2_data_source>?,
                              _ context: UnsafeMutableRawPointer?) -> Int {
    guard let buffer, let flags else { return Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue) }
    let count = withClientSession(context) { owner in
        owner.withRequest(stream) { HTTP2ClientSession.readBody($0, into: buffer, length: length, flags: flags) }
    }
    return count ?? Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue)
}
