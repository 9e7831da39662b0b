import Foundation
import HeraldTLS

/// The bytes of one Redis connection over a connected non-blocking socket, in clear or through TLS. Every call
/// returns at once; `.wouldBlock` says which readiness to wait for. Once made, it owns the socket: `close` closes it.
final class RedisStream {
    enum Transfer {
        /// Bytes read or written (0 for a finished handshake).
        case moved(Int)
        case wouldBlock(wantsWrite: Bool)
        case closedByPeer
        case failed(String)
    }

    let descriptor: Int32
    private let tls: TLSStream?

    /// A stream over `descriptor`; with `tls`, a TLS client session that verifies the certificate against `host`.
    init(descriptor: Int32, tls: RedisTLS?, host: String) throws(RedisError) {
        self.descriptor = descriptor
        guard let tls else {
            self.tls = nil
            return
        }
        let session: TLSStream
        do { session = try TLSStream(context: tls.context, descriptor: descriptor, serverName: host) } catch {
            throw RedisError(.connection, "TLS: \(error.message)")
        }
        // Both connections read until `.wouldBlock` before they wait (the pool's `fill`, the loop's `readReplies`).
        session.readAhead()
        self.tls = session
    }

    var isSecured: Bool { tls != nil }

    /// One step of the TLS handshake: `.moved(0)` when done (at once in clear).
    func handshake() -> Transfer {
        guard let tls else { return .moved(0) }
        return Self.transfer(tls.handshake())
    }

    func read(into buffer: UnsafeMutableRawBufferPointer) -> Transfer {
        if let tls { return Self.transfer(tls.read(into: buffer)) }
        while true {
            let count = Glibc.read(descriptor, buffer.baseAddress, buffer.count)
            if count > 0 { return .moved(count) }
            if count == 0 { return .closedByPeer }
            if errno == EINTR { continue }
            if errno == EAGAIN || errno == EWOULDBLOCK { return .wouldBlock(wantsWrite: false) }
            return .failed(String(cString: strerror(errno)))
        }
    }

    func write(_ buffer: UnsafeRawBufferPointer) -> Transfer {
        if let tls { return Self.transfer(tls.write(buffer)) }
        while true {
            let sent = send(descriptor, buffer.baseAddress, buffer.count, Int32(MSG_NOSIGNAL))
            if sent >= 0 { return .moved(sent) }
            if errno == EINTR { continue }
            if errno == EAGAIN || errno == EWOULDBLOCK { return .wouldBlock(wantsWrite: true) }
            return .failed(String(cString: strerror(errno)))
        }
    }

    /// Sends TLS close_notify (best effort) and closes the socket. The owner unwatches it first.
    func close() {
        tls?.shutdown()
        Glibc.close(descriptor)
    }

    private static func transfer(_ result: TLSStream.IOResult) -> Transfer {
        switch result {
        case .done(let count): .moved(count)
        case .wouldBlock(let wantsWrite): .wouldBlock(wantsWrite: wantsWrite)
        case .closedByPeer: .closedByPeer
        case .failed(let failure): .failed("TLS: " + failure.message)
        }
    }
}
