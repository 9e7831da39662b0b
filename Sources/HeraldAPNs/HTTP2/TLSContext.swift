import Foundation
internal import COpenSSL
internal import CHeraldShims

/// The client SSL_CTX: TLS 1.2+, ALPN `h2`, peer verification against the system store plus an optional extra CA
/// file. There is deliberately no way to turn verification off.
final class TLSContext: @unchecked Sendable {  // @unchecked: configured once in init, then only read (SSL_new), which OpenSSL allows from any thread.
    let pointer: OpaquePointer

    init(extraCAFile: String?) throws(APNsError) {
        guard let context = SSL_CTX_new(TLS_client_method()) else {
            throw APNsError(.invalidConfiguration, "SSL_CTX_new failed" + TLSContext.errors())
        }
        pointer = context
        guard herald_ssl_ctx_set_min_proto_version(context, TLS1_2_VERSION) == 1 else {
            throw APNsError(.invalidConfiguration, "cannot require TLS 1.2" + TLSContext.errors())
        }
        // Non-blocking writes may be partial, and a retried write may come from a moved Swift buffer.
        _ = herald_ssl_ctx_set_mode(context, Int(SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER))
        SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nil)
        guard SSL_CTX_set_default_verify_paths(context) == 1 else {
            throw APNsError(.invalidConfiguration, "cannot load the system trust store" + TLSContext.errors())
        }
        if let extraCAFile {
            guard SSL_CTX_load_verify_locations(context, extraCAFile, nil) == 1 else {
                throw APNsError(.invalidConfiguration, "cannot load CA file \(extraCAFile)" + TLSContext.errors())
            }
        }
        let alpn: [UInt8] = [2, UInt8(ascii: "h"), UInt8(ascii: "2")]
        // SSL_CTX_set_alpn_protos returns 0 on success.
        guard SSL_CTX_set_alpn_protos(context, alpn, UInt32(alpn.count)) == 0 else {
            throw APNsError(.invalidConfiguration, "cannot set ALPN" + TLSContext.errors())
        }
    }

    deinit { SSL_CTX_free(pointer) }

    /// Drains OpenSSL's thread-local error queue into text.
    static func errors() -> String {
        var parts: [String] = []
        while case let code = ERR_get_error(), code != 0 {
            var buffer = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &buffer, buffer.count)
            parts.append(String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        return parts.isEmpty ? "" : " (" + parts.joined(separator: "; ") + ")"
    }
}
