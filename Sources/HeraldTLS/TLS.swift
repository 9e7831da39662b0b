import Foundation
import HeraldCrypto
import HeraldRuntime
internal import COpenSSL
internal import CHeraldShims

/// An SSL_CTX: TLS 1.2 or newer, set up for partial non-blocking writes. Configured once, then only
/// read (SSL_new), which OpenSSL allows from any thread.
public final class TLSContext: @unchecked Sendable {
    let pointer: OpaquePointer

    private init(method: OpaquePointer?) throws(ConfigurationError) {
        guard let context = SSL_CTX_new(method) else {
            throw ConfigurationError("tls", "SSL_CTX_new failed" + OpenSSLErrors.drain())
        }
        pointer = context
        guard herald_ssl_ctx_set_min_proto_version(context, TLS1_2_VERSION) == 1 else {
            throw ConfigurationError("tls", "cannot require TLS 1.2" + OpenSSLErrors.drain())
        }
        // Non-blocking writes may be partial, and a retried write may come from a moved Swift buffer.
        _ = herald_ssl_ctx_set_mode(context, Int(SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER))
    }

    deinit { SSL_CTX_free(pointer) }

    /// A client's: verifies the peer against the system trust store plus `extraCAFile`, offers `alpn` (none when
    /// empty), and presents `identity` (a certificate chain and its key) to a server that asks for one. There is
    /// deliberately no way to turn verification off.
    public static func client(extraCAFile: String?, alpn: [String] = ["h2"],
                              identity: (certificateChain: String, privateKey: String)? = nil) throws(ConfigurationError) -> TLSContext {
        let context = try TLSContext(method: TLS_client_method())
        SSL_CTX_set_verify(context.pointer, SSL_VERIFY_PEER, nil)
        guard SSL_CTX_set_default_verify_paths(context.pointer) == 1 else {
            throw ConfigurationError("tls", "cannot load the system trust store" + OpenSSLErrors.drain())
        }
        if let extraCAFile {
            guard SSL_CTX_load_verify_locations(context.pointer, extraCAFile, nil) == 1 else {
                throw ConfigurationError("tls", "cannot load CA file \(extraCAFile)" + OpenSSLErrors.drain())
            }
        }
        if let identity { try context.use(identity.certificateChain, identity.privateKey) }
        if !alpn.isEmpty {
            let wire = alpn.flatMap { [UInt8($0.utf8.count)] + Array($0.utf8) }
            // SSL_CTX_set_alpn_protos returns 0 on success.
            guard SSL_CTX_set_alpn_protos(context.pointer, wire, UInt32(wire.count)) == 0 else {
                throw ConfigurationError("tls", "cannot set ALPN" + OpenSSLErrors.drain())
            }
        }
        return context
    }

    /// A server's: the given certificate chain and key, ALPN `h2` only, no renegotiation or compression.
    public static func server(certificateChain: String, privateKey: String) throws(ConfigurationError) -> TLSContext {
        let context = try TLSContext(method: TLS_server_method())
        herald_ssl_ctx_set_server_options(context.pointer)
        try context.use(certificateChain, privateKey)
        herald_ssl_ctx_require_alpn_h2(context.pointer)
        return context
    }

    /// Loads a certificate chain and the private key that goes with it.
    private func use(_ certificateChain: String, _ privateKey: String) throws(ConfigurationError) {
        guard SSL_CTX_use_certificate_chain_file(pointer, certificateChain) == 1 else {
            throw ConfigurationError("cert", "cannot load the certificate chain \(certificateChain)" + OpenSSLErrors.drain())
        }
        guard SSL_CTX_use_PrivateKey_file(pointer, privateKey, SSL_FILETYPE_PEM) == 1 else {
            throw ConfigurationError("cert-key", "cannot load the private key \(privateKey)" + OpenSSLErrors.drain())
        }
        guard SSL_CTX_check_private_key(pointer) == 1 else {
            throw ConfigurationError("cert-key", "\(privateKey) does not match \(certificateChain)" + OpenSSLErrors.drain())
        }
    }
}

/// One TLS session over a non-blocking socket the caller owns (and closes after this is gone). Used by one
/// thread at a time. Every call returns at once: `.wouldBlock` says which readiness to wait for.
public final class TLSStream {
    public enum IOResult {
        /// Bytes read or written; 0 for a finished handshake.
        case done(Int)
        /// Retry when the socket is readable (`wantsWrite` false) or writable (true).
        case wouldBlock(wantsWrite: Bool)
        /// The peer ended the session (close_notify), or went away during the handshake without a TLS alert.
        case closedByPeer
        case failed(TLSFailure)
    }

    private let ssl: OpaquePointer

    /// A client session when `serverName` is given (sent as SNI and verified against the certificate; an IP
    /// address is verified against its IP SANs and not sent), a server session otherwise.
    public init(context: TLSContext, descriptor: Int32, serverName: String?) throws(ConfigurationError) {
        guard let ssl = SSL_new(context.pointer) else { throw ConfigurationError("tls", "SSL_new failed" + OpenSSLErrors.drain()) }
        self.ssl = ssl
        SSL_set_fd(ssl, descriptor)
        guard let serverName else {
            SSL_set_accept_state(ssl)
            return
        }
        SSL_set_connect_state(ssl)
        if Self.isIPAddress(serverName) {
            // No SNI for IP literals (RFC 6066).
            X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), serverName)
        } else {
            _ = herald_ssl_set_tlsext_host_name(ssl, serverName)
            SSL_set1_host(ssl, serverName)
        }
    }

    deinit { SSL_free(ssl) }

    private static func isIPAddress(_ host: String) -> Bool {
        var buffer = in6_addr()
        return inet_pton(AF_INET, host, &buffer) == 1 || inet_pton(AF_INET6, host, &buffer) == 1
    }

    /// Lets OpenSSL read as much as the socket has, not one record header and body at a time: fewer reads, but
    /// decrypted bytes may then wait inside OpenSSL with the socket quiet, so only for a caller that reads until
    /// `.wouldBlock` before it waits for readability.
    public func readAhead() { SSL_set_read_ahead(ssl, 1) }

    /// One step of the handshake: `.done(0)` when finished.
    public func handshake() -> IOResult {
        let result = SSL_do_handshake(ssl)
        if result == 1 { return .done(0) }
        let error = SSL_get_error(ssl, result)
        switch error {
        case SSL_ERROR_WANT_READ: return .wouldBlock(wantsWrite: false)
        case SSL_ERROR_WANT_WRITE: return .wouldBlock(wantsWrite: true)
        case SSL_ERROR_ZERO_RETURN: return .closedByPeer
        // The socket was reset, or reached its end with no TLS alert (OpenSSL 3 reports that as an SSL error,
        // "unexpected eof while reading"): the peer went away, nothing was refused.
        case SSL_ERROR_SYSCALL where ERR_peek_error() == 0:
            return .closedByPeer
        case SSL_ERROR_SSL where Int32(ERR_peek_error() & 0x7F_FFFF) == SSL_R_UNEXPECTED_EOF_WHILE_READING:
            ERR_clear_error()
            return .closedByPeer
        default:
            // A server that speaks no protocol we offered may refuse the handshake with this alert.
            if Int32(ERR_peek_error() & 0x7F_FFFF) == SSL_R_TLSV1_ALERT_NO_APPLICATION_PROTOCOL {
                return .failed(TLSFailure(message: OpenSSLErrors.drain(), peerRefusedALPN: true))
            }
            let verify = SSL_get_verify_result(ssl)
            guard verify == X509_V_OK else {
                return .failed(TLSFailure(message: String(cString: X509_verify_cert_error_string(verify)) + OpenSSLErrors.drain(),
                                          certificateRefused: true))
            }
            return .failed(TLSFailure(message: "handshake failed" + OpenSSLErrors.drain()))
        }
    }

    /// True when ALPN selected `h2` (a client that offered no ALPN at all selects nothing).
    public var negotiatedH2: Bool {
        var data: UnsafePointer<UInt8>?
        var length: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &data, &length)
        guard let data, length == 2 else { return false }
        return data[0] == UInt8(ascii: "h") && data[1] == UInt8(ascii: "2")
    }

    public var protocolVersion: String { String(cString: SSL_get_version(ssl)) }

    public func read(into buffer: UnsafeMutableRawBufferPointer) -> IOResult {
        transferred(SSL_read(ssl, buffer.baseAddress, Int32(buffer.count)))
    }

    public func write(_ buffer: UnsafeRawBufferPointer) -> IOResult {
        transferred(SSL_write(ssl, buffer.baseAddress, Int32(buffer.count)))
    }

    /// Sends close_notify (best effort; the socket is closed right after).
    public func shutdown() {
        _ = SSL_shutdown(ssl)
        ERR_clear_error()
    }

    private func transferred(_ result: Int32) -> IOResult {
        if result > 0 { return .done(Int(result)) }
        let failedErrno = errno
        switch SSL_get_error(ssl, result) {
        case SSL_ERROR_WANT_READ: return .wouldBlock(wantsWrite: false)
        case SSL_ERROR_WANT_WRITE: return .wouldBlock(wantsWrite: true)
        case SSL_ERROR_ZERO_RETURN:
            ERR_clear_error()
            return .closedByPeer
        default:
            let reason = failedErrno != 0 ? String(cString: strerror(failedErrno)) : "end of stream"
            return .failed(TLSFailure(message: reason + OpenSSLErrors.drain()))
        }
    }
}

/// Why a TLS session failed, for an error message.
public struct TLSFailure: Error, Sendable {
    public var message: String
    /// The peer refused the handshake for want of a common ALPN protocol.
    public var peerRefusedALPN = false
    /// The peer's certificate failed verification (untrusted, expired, for another host): trying again cannot help.
    public var certificateRefused = false
}
