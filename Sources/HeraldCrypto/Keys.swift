import Foundation
internal import COpenSSL
internal import CHeraldShims

/// JWS signature algorithms Herald signs or verifies.
public enum SignatureAlgorithm: String, Sendable, CaseIterable {
    /// ECDSA P-256 with SHA-256; the signature is raw r‖s (64 bytes), as JWTs require.
    case es256 = "ES256"
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    case rs256 = "RS256"
}

public struct CryptoError: Error, CustomStringConvertible, Equatable {
    public enum Code: Sendable, Equatable { case invalidKey, unsupportedKey, signingFailed, invalidSignature }
    public var code: Code
    public var message: String

    init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message + OpenSSLErrors.drain()
    }

    public var description: String { message }
}

/// OpenSSL's thread-local error queue.
public enum OpenSSLErrors {
    /// Drains the queue into text for an error message (`" (reason; reason)"`, or "" when empty), so stale
    /// entries never leak into a later call's report.
    public static func drain() -> String {
        var parts: [String] = []
        while case let code = ERR_get_error(), code != 0 {
            var buffer = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &buffer, buffer.count)
            parts.append(String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        return parts.isEmpty ? "" : " (" + parts.joined(separator: "; ") + ")"
    }
}

/// An EVP_PKEY with exactly one owner.
final class KeyHandle: @unchecked Sendable {  // @unchecked: the key is immutable after creation; OpenSSL 3 keys are safe to share read-only.
    let pointer: OpaquePointer

    init(_ pointer: OpaquePointer) { self.pointer = pointer }
    deinit { EVP_PKEY_free(pointer) }

    static let supported = "only P-256 EC keys and RSA keys of at least 2048 bits are supported"

    /// ES256 for a P-256 key, RS256 for an RSA key of at least 2048 bits; nil for any other key (another
    /// 256-bit curve such as secp256k1 or brainpoolP256r1 included).
    var algorithm: SignatureAlgorithm? {
        switch EVP_PKEY_get_base_id(pointer) {
        case EVP_PKEY_EC: curveName == "prime256v1" ? .es256 : nil
        case EVP_PKEY_RSA: EVP_PKEY_get_bits(pointer) >= 2048 ? .rs256 : nil
        default: nil
        }
    }

    private var curveName: String? {
        var name = [UInt8](repeating: 0, count: 64)
        var length = 0
        let found = name.withUnsafeMutableBufferPointer { buffer in
            buffer.withMemoryRebound(to: CChar.self) { EVP_PKEY_get_group_name(pointer, $0.baseAddress, $0.count, &length) }
        }
        guard found == 1, length < name.count else { return nil }
        return String(decoding: name[..<length], as: UTF8.self)
    }
}

/// A private signing key: P-256 (ES256, e.g. an APNs `.p8` key) or RSA (RS256).
public struct PrivateKey: Sendable {
    let handle: KeyHandle
    public let algorithm: SignatureAlgorithm
    /// Lowercase hex SHA-256 of the public key (DER SubjectPublicKeyInfo): tells two keys apart without them.
    public let fingerprint: String

    /// Reads a PEM private key (PKCS#8 `BEGIN PRIVATE KEY`, as in Apple's `.p8` files, or traditional forms).
    public init(pem: String) throws {
        guard let key = PEMReader.read(pem, { bio in PEM_read_bio_PrivateKey(bio, nil, nil, nil) }) else {
            throw CryptoError(.invalidKey, "not a PEM private key")
        }
        try self.init(handle: KeyHandle(key))
    }

    private init(handle: KeyHandle) throws {
        guard let algorithm = handle.algorithm else { throw CryptoError(.unsupportedKey, KeyHandle.supported) }
        self.handle = handle
        self.algorithm = algorithm
        let length = i2d_PUBKEY(handle.pointer, nil)
        guard length > 0 else { throw CryptoError(.invalidKey, "the public key cannot be encoded") }
        var der = [UInt8](repeating: 0, count: Int(length))
        der.withUnsafeMutableBufferPointer { buffer in
            var cursor = buffer.baseAddress
            _ = i2d_PUBKEY(handle.pointer, &cursor)
        }
        fingerprint = Hex.encode(SHA256.hash(der))
    }

    /// A fresh P-256 key (for tests, `heraldctl`, and the simulator's own material).
    public static func generateP256() throws -> PrivateKey {
        try generate(EVP_PKEY_EC) { EVP_PKEY_CTX_set_ec_paramgen_curve_nid($0, NID_X9_62_prime256v1) }
    }

    /// A fresh RSA key of `bits` bits.
    public static func generateRSA(bits: Int32 = 2048) throws -> PrivateKey {
        try generate(EVP_PKEY_RSA) { EVP_PKEY_CTX_set_rsa_keygen_bits($0, bits) }
    }

    private static func generate(_ type: Int32, _ configure: (OpaquePointer) -> Int32) throws -> PrivateKey {
        guard let context = EVP_PKEY_CTX_new_id(type, nil) else { throw CryptoError(.invalidKey, "keygen context") }
        defer { EVP_PKEY_CTX_free(context) }
        var key: OpaquePointer?
        guard EVP_PKEY_keygen_init(context) == 1, configure(context) == 1, EVP_PKEY_keygen(context, &key) == 1,
              let key else { throw CryptoError(.invalidKey, "key generation failed") }
        return try PrivateKey(handle: KeyHandle(key))
    }

    /// The key as PKCS#8 PEM (`BEGIN PRIVATE KEY`), the `.p8` format.
    public var pem: String {
        PEMWriter.write { bio in PEM_write_bio_PrivateKey(bio, handle.pointer, nil, nil, 0, nil, nil) }
    }

    /// The matching public key.
    public var publicKey: PublicKey {
        let pem = PEMWriter.write { bio in PEM_write_bio_PUBKEY(bio, handle.pointer) }
        return try! PublicKey(pem: pem)
    }

    /// Signs `message` with SHA-256; ES256 signatures are returned as raw r‖s.
    public func sign(_ message: some Collection<UInt8>) throws -> [UInt8] {
        guard let context = EVP_MD_CTX_new() else { throw CryptoError(.signingFailed, "digest context") }
        defer { EVP_MD_CTX_free(context) }
        let input = Array(message)
        var length = 0
        guard EVP_DigestSignInit(context, nil, EVP_sha256(), nil, handle.pointer) == 1,
              EVP_DigestSign(context, nil, &length, input, input.count) == 1 else {
            throw CryptoError(.signingFailed, "signing failed")
        }
        var signature = [UInt8](repeating: 0, count: length)
        guard EVP_DigestSign(context, &signature, &length, input, input.count) == 1 else {
            throw CryptoError(.signingFailed, "signing failed")
        }
        signature.removeSubrange(length...)
        return algorithm == .es256 ? try ECDSASignature.derToRaw(signature) : signature
    }
}

/// A public verification key: P-256 (ES256) or RSA (RS256).
public struct PublicKey: Sendable {
    let handle: KeyHandle
    public let algorithm: SignatureAlgorithm

    /// Reads a PEM public key (`BEGIN PUBLIC KEY`), or the public key of a PEM certificate.
    public init(pem: String) throws {
        let key = PEMReader.read(pem, { bio in PEM_read_bio_PUBKEY(bio, nil, nil, nil) })
            ?? PEMReader.read(pem, { bio -> OpaquePointer? in
                guard let certificate = PEM_read_bio_X509(bio, nil, nil, nil) else { return nil }
                defer { X509_free(certificate) }
                return X509_get_pubkey(certificate)
            })
        guard let key else { throw CryptoError(.invalidKey, "not a PEM public key or certificate") }
        let handle = KeyHandle(key)
        guard let algorithm = handle.algorithm else {
            throw CryptoError(.unsupportedKey, KeyHandle.supported)
        }
        self.handle = handle
        self.algorithm = algorithm
    }

    public var pem: String { PEMWriter.write { bio in PEM_write_bio_PUBKEY(bio, handle.pointer) } }

    /// True when `signature` (raw r‖s for ES256) is this key's SHA-256 signature of `message`.
    public func verify(_ signature: [UInt8], for message: some Collection<UInt8>) -> Bool {
        let encoded: [UInt8]
        if algorithm == .es256 {
            guard let der = ECDSASignature.rawToDER(signature) else { return false }
            encoded = der
        } else {
            encoded = signature
        }
        guard let context = EVP_MD_CTX_new() else { return false }
        defer {
            EVP_MD_CTX_free(context)
            _ = OpenSSLErrors.drain()
        }
        let input = Array(message)
        return EVP_DigestVerifyInit(context, nil, EVP_sha256(), nil, handle.pointer) == 1
            && EVP_DigestVerify(context, encoded, encoded.count, input, input.count) == 1
    }
}

/// ECDSA signatures: OpenSSL speaks DER, JWS speaks raw r‖s.
enum ECDSASignature {
    static func derToRaw(_ der: [UInt8]) throws -> [UInt8] {
        var cursor: UnsafePointer<UInt8>? = nil
        let parsed: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            cursor = buffer.baseAddress
            return d2i_ECDSA_SIG(nil, &cursor, buffer.count)
        }
        guard let parsed else { throw CryptoError(.signingFailed, "malformed ECDSA signature") }
        defer { ECDSA_SIG_free(parsed) }
        var r: OpaquePointer?, s: OpaquePointer?
        ECDSA_SIG_get0(parsed, &r, &s)
        var raw = [UInt8](repeating: 0, count: 64)
        guard BN_bn2binpad(r, &raw, 32) == 32,
              raw.withUnsafeMutableBufferPointer({ BN_bn2binpad(s, $0.baseAddress! + 32, 32) }) == 32 else {
            throw CryptoError(.signingFailed, "ECDSA signature too long")
        }
        return raw
    }

    static func rawToDER(_ raw: [UInt8]) -> [UInt8]? {
        guard raw.count == 64, let signature = ECDSA_SIG_new() else { return nil }
        defer { ECDSA_SIG_free(signature) }
        let r = BN_bin2bn(raw, 32, nil)
        let s = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress! + 32, 32, nil) }
        guard ECDSA_SIG_set0(signature, r, s) == 1 else {
            BN_free(r)
            BN_free(s)
            return nil
        }
        var out: UnsafeMutablePointer<UInt8>? = nil
        let length = i2d_ECDSA_SIG(signature, &out)
        guard length > 0, let out else { return nil }
        defer { herald_openssl_free(out) }
        return Array(UnsafeBufferPointer(start: out, count: Int(length)))
    }
}

enum PEMReader {
    static func read(_ pem: String, _ body: (OpaquePointer) -> OpaquePointer?) -> OpaquePointer? {
        let bytes = Array(pem.utf8)
        return bytes.withUnsafeBytes { buffer -> OpaquePointer? in
            guard let bio = BIO_new_mem_buf(buffer.baseAddress, Int32(buffer.count)) else { return nil }
            defer { BIO_free(bio) }
            let result = body(bio)
            _ = OpenSSLErrors.drain()
            return result
        }
    }
}

/// Text written by an OpenSSL `PEM_write_bio_*` function.
public enum PEMWriter {
    public static func write(_ body: (OpaquePointer) -> Int32) -> String {
        guard let bio = BIO_new(BIO_s_mem()) else { return "" }
        defer { BIO_free(bio) }
        guard body(bio) == 1 else { return "" }
        let length = Int(BIO_ctrl_pending(bio))
        var buffer = [UInt8](repeating: 0, count: length)
        _ = BIO_read(bio, &buffer, Int32(length))
        return String(decoding: buffer, as: UTF8.self)
    }
}
