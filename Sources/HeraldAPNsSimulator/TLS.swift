import HeraldCrypto
import Foundation
import HeraldRuntime
internal import COpenSSL
internal import CHeraldShims

/// The server's SSL_CTX: TLS 1.2 or newer, ALPN `h2` only, the given certificate chain and key.
final class TLSServerContext: @unchecked Sendable {  // @unchecked: configured once in init; SSL_CTX is safe to share for SSL_new.
    let pointer: OpaquePointer

    init(certificateChain: String, privateKey: String) throws(ConfigurationError) {
        guard let context = SSL_CTX_new(TLS_server_method()) else {
            throw ConfigurationError("tls", "SSL_CTX_new failed" + OpenSSLErrors.drain())
        }
        pointer = context
        guard herald_ssl_ctx_set_min_proto_version(context, TLS1_2_VERSION) == 1 else {
            throw ConfigurationError("tls", "cannot require TLS 1.2" + OpenSSLErrors.drain())
        }
        herald_ssl_ctx_set_server_options(context)
        _ = herald_ssl_ctx_set_mode(context, Int(SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER))
        guard SSL_CTX_use_certificate_chain_file(context, certificateChain) == 1 else {
            throw ConfigurationError("cert", "cannot load the certificate chain \(certificateChain)" + OpenSSLErrors.drain())
        }
        guard SSL_CTX_use_PrivateKey_file(context, privateKey, SSL_FILETYPE_PEM) == 1 else {
            throw ConfigurationError("cert-key", "cannot load the private key \(privateKey)" + OpenSSLErrors.drain())
        }
        guard SSL_CTX_check_private_key(context) == 1 else {
            throw ConfigurationError("cert-key", "\(privateKey) does not match \(certificateChain)" + OpenSSLErrors.drain())
        }
        herald_ssl_ctx_require_alpn_h2(context)
    }

    deinit { SSL_CTX_free(pointer) }
}

/// One server-side TLS session over a non-blocking socket. Used by one connection thread only.
final class TLSStream {
    enum IOResult {
        case done(Int)
        /// Retry when the socket is readable (`wantsWrite` false) or writable (true).
        case wouldBlock(wantsWrite: Bool)
        case closed
    }

    private let ssl: OpaquePointer

    init(context: TLSServerContext, descriptor: Int32) throws(ConfigurationError) {
        guard let ssl = SSL_new(context.pointer) else { throw ConfigurationError("tls", "SSL_new failed") }
        self.ssl = ssl
        SSL_set_fd(ssl, descriptor)
    }

    deinit { SSL_free(ssl) }

    /// One step of the handshake: `.done(0)` when finished.
    func acceptStep() -> IOResult { classify(SSL_accept(ssl)) }

    /// True when ALPN selected `h2` (a client that offered no ALPN at all selects nothing).
    var negotiatedH2: Bool {
        var data: UnsafePointer<UInt8>?
        var length: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &data, &length)
        guard let data, length == 2 else { return false }
        return data[0] == UInt8(ascii: "h") && data[1] == UInt8(ascii: "2")
    }

    var protocolVersion: String { String(cString: SSL_get_version(ssl)) }

    func read(into buffer: UnsafeMutableRawBufferPointer) -> IOResult {
        classify(SSL_read(ssl, buffer.baseAddress, Int32(buffer.count)))
    }

    func write(_ buffer: UnsafeRawBufferPointer) -> IOResult {
        classify(SSL_write(ssl, buffer.baseAddress, Int32(buffer.count)))
    }

    /// Sends close_notify (best effort; the socket is closed right after).
    func shutdown() { _ = SSL_shutdown(ssl) }

    private func classify(_ result: Int32) -> IOResult {
        if result > 0 { return .done(Int(result)) }
        let error = SSL_get_error(ssl, result)
        defer { ERR_clear_error() }
        switch error {
        case SSL_ERROR_WANT_READ: return .wouldBlock(wantsWrite: false)
        case SSL_ERROR_WANT_WRITE: return .wouldBlock(wantsWrite: true)
        case SSL_ERROR_NONE: return .done(0)
        default: return .closed
        }
    }
}
