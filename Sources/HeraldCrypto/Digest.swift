import Foundation
internal import COpenSSL
internal import CHeraldShims

/// SHA-256 through OpenSSL.
public enum SHA256 {
    public static func hash(_ bytes: some Collection<UInt8>) -> [UInt8] {
        // Contiguous input (an array, a string's bytes) is hashed where it lies; anything else is copied first.
        if let digest = bytes.withContiguousStorageIfAvailable({ hash($0) }) { return digest }
        return Array(bytes).withUnsafeBufferPointer { hash($0) }
    }

    private static func hash(_ buffer: UnsafeBufferPointer<UInt8>) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: Int(SHA256_DIGEST_LENGTH)) { digest, count in
            herald_sha256(buffer.baseAddress, buffer.count, digest.baseAddress)
            count = Int(SHA256_DIGEST_LENGTH)
        }
    }

    public static func hash(_ string: String) -> [UInt8] { hash(string.utf8) }

    /// Lowercase hex of the digest, as stored in the apps file for API keys.
    public static func hex(_ string: String) -> String { Hex.encode(hash(string)) }
}

/// HMAC-SHA256 through OpenSSL (job signatures, channel grants).
public enum HMACSHA256 {
    public static func authenticate(_ message: [UInt8], key: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: Int(SHA256_DIGEST_LENGTH))
        var length: UInt32 = 0
        let done = key.withUnsafeBufferPointer { keyBytes in
            message.withUnsafeBufferPointer { messageBytes in
                HMAC(EVP_sha256(), keyBytes.baseAddress, Int32(keyBytes.count), messageBytes.baseAddress,
                     messageBytes.count, &digest, &length)
            }
        }
        guard done != nil, length == digest.count else { fatalError("HMAC-SHA256 failed") }
        return digest
    }
}

/// Lowercase hexadecimal.
public enum Hex {
    // Written straight into the string's storage: no digit table or byte array to allocate per call (this runs
    // for every API key lookup and record id on the ingest hot path). Inlinable so each caller gets it specialised
    // for its collection type: the generic version iterated through witness tables, 3 % of a subscribe request.
    @inlinable
    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        String(unsafeUninitializedCapacity: bytes.count * 2) { out in
            var index = 0
            for byte in bytes {
                out[index] = digit(byte >> 4)
                out[index + 1] = digit(byte & 0xf)
                index += 2
            }
            return index
        }
    }

    @inlinable @inline(__always)
    static func digit(_ nibble: UInt8) -> UInt8 { nibble < 10 ? 0x30 + nibble : 0x57 + nibble }

    /// Bytes of an even-length hex string (either case), or nil.
    public static func decode(_ text: String) -> [UInt8]? {
        let chars = Array(text.utf8)
        guard chars.count % 2 == 0 else { return nil }
        var out = [UInt8]()
        out.reserveCapacity(chars.count / 2)
        var index = 0
        while index < chars.count {
            guard let high = value(chars[index]), let low = value(chars[index + 1]) else { return nil }
            out.append(high << 4 | low)
            index += 2
        }
        return out
    }

    private static func value(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

/// Cryptographically secure random bytes (OpenSSL's RAND_bytes).
public enum SecureRandom {
    public static func bytes(_ count: Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        guard RAND_bytes(&out, Int32(count)) == 1 else { fatalError("RAND_bytes failed: no entropy source") }
        return out
    }

    /// `count` random bytes as lowercase hex (2 × count characters).
    public static func hex(_ count: Int) -> String { Hex.encode(bytes(count)) }
}

/// Comparison whose time does not depend on where two secrets first differ.
public enum ConstantTime {
    public static func equals(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        if a.isEmpty { return true }
        return CRYPTO_memcmp(a, b, a.count) == 0
    }
}

/// What logs say instead of a credential: a short SHA-256 prefix, stable so lines about one token correlate.
public enum Redaction {
    public static func tag(_ secret: String) -> String {
        "sha256:" + String(Hex.encode(SHA256.hash(secret)).prefix(12))
    }
}

/// Base64url without padding (RFC 7515), as used by JWTs.
public enum Base64URL {
    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    public static func decode(_ text: some StringProtocol) -> [UInt8]? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        guard !base64.contains("=") else { return nil }
        switch base64.count % 4 {
        case 0: break
        case 2: base64 += "=="
        case 3: base64 += "="
        default: return nil
        }
        return Data(base64Encoded: base64).map { Array($0) }
    }
}
