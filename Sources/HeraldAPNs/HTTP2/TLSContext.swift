import HeraldCrypto
import Foundation
internal import COpenSSL
internal import CHeraldShims

/// The client SSL_CTX: TLS 1.2+, ALPN `h2`, peer verification against the system store plus an optional extra CA
/// file. There is deliberately no way to turn verification off.
final class TLSContext: @unchecked Sendable {  // @unchecked: configured once in init, then only read (SSL_new), which OpenSSL allows from any thread.
    let pointer: OpaquePointer

    init(extraCAFile: String?) throws(APNsError) {
        guard let context = SSL_CTX_new(TLS_client_method()) else {
            throw APNsError(.invalidConfiguration, "SSL_CTX_new failed" + OpenSSLErrors.drain())
        }
        pointer = context
        guard herald_ssl_ctx_set_min_proto_version(context, TLS1_2_VERSION) == 1 else {
            throw APNsError(.invalidConfiguration, "cannot require TLS 1.2" + OpenSSLErrors.drain())
        }
        // Non-blocking writes may be partial, and a retried write may come from a moved Swift buffer.
        _ = herald_ssl_ctx_set_mode(context, Int(SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER))
        SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nil)
        guard SSL_CTX_set_default_verify_paths(context) == 1 else {
            throw APNsError(.invalidConfiguration, "cannot load the system trust store" + OpenSSLErrors.drain())
        }
        if let extraCAFile {
            guard SSL_CTX_load_verify_locations(context, extraCAFile, nil) == 1 else {
                throw APNsError(.invalidConfiguration, "cannot load CA file \(extraCAFile)" + OpenSSLErrors.drain())
            }
        }
        let alpn: [UInt8] = [2, UInt8(ascii: "h"), UInt8(ascii: "2")]
        // SSL_CTX_set_alpn_protos returns 0 on success.
        guard SSL_CTX_set_alpn_protos(context, alpn, UInt32(alpn.count)) == 0 else {
            throw APNsError(.invalidConfiguration, "cannot set ALPN" + OpenSSLErrors.drain())
        }
    }

    deinit { SSL_CTX_free(pointer) }
}
