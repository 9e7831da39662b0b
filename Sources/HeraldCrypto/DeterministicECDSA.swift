internal import COpenSSL

extension PrivateKey {
    /// Signs `message` with ES256 (P-256, SHA-256) using the nonce of RFC 6979 (derived from the key and the
    /// message, not drawn at random), returned as raw r‖s: the same key signs the same message identically in every
    /// process, so instances that sign the same APNs provider token claims share one token without talking to each
    /// other. Verifies as any ES256 signature does.
    public func signDeterministically(_ message: some Collection<UInt8>) throws -> [UInt8] {
        guard algorithm == .es256 else { throw CryptoError(.unsupportedKey, "deterministic signatures are ES256 only") }
        guard let context = BN_CTX_new() else { throw CryptoError(.signingFailed, "BN_CTX_new") }
        defer { BN_CTX_free(context) }
        guard let group = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1) else {
            throw CryptoError(.signingFailed, "P-256 group")
        }
        defer { EC_GROUP_free(group) }
        let order = EC_GROUP_get0_order(group)!
        var secret: OpaquePointer?
        guard EVP_PKEY_get_bn_param(handle.pointer, "priv", &secret) == 1, let secret else {
            throw CryptoError(.signingFailed, "the key's private scalar")
        }
        defer { BN_clear_free(secret) }
        BN_set_flags(secret, BN_FLG_CONSTTIME)
        var privateOctets = [UInt8](repeating: 0, count: 32)
        defer { privateOctets.withUnsafeMutableBytes { $0.initializeMemory(as: UInt8.self, repeating: 0) } }
        guard BN_bn2binpad(secret, &privateOctets, 32) == 32 else { throw CryptoError(.signingFailed, "private scalar") }

        // z = bits2int(SHA-256(message)); for P-256 the digest and the order have the same length (256 bits).
        let digest = SHA256.hash(Array(message))
        let z = try Self.number(digest)
        defer { BN_free(z) }
        let reduced = try Self.number([])
        defer { BN_free(reduced) }
        guard BN_nnmod(reduced, z, order, context) == 1 else { throw CryptoError(.signingFailed, "z mod n") }
        var digestOctets = [UInt8](repeating: 0, count: 32) // bits2octets(h1)
        guard BN_bn2binpad(reduced, &digestOctets, 32) == 32 else { throw CryptoError(.signingFailed, "bits2octets") }

        // RFC 6979 section 3.2: HMAC-DRBG seeded with the key and the digest.
        var v = [UInt8](repeating: 0x01, count: 32)
        var k = [UInt8](repeating: 0x00, count: 32)
        k = HMACSHA256.authenticate(v + [0x00] + privateOctets + digestOctets, key: k)
        v = HMACSHA256.authenticate(v, key: k)
        k = HMACSHA256.authenticate(v + [0x01] + privateOctets + digestOctets, key: k)
        v = HMACSHA256.authenticate(v, key: k)
        defer { k.withUnsafeMutableBytes { $0.initializeMemory(as: UInt8.self, repeating: 0) } }

        guard let point = EC_POINT_new(group) else { throw CryptoError(.signingFailed, "EC_POINT_new") }
        defer { EC_POINT_free(point) }
        let nonce = try Self.number([]), r = try Self.number([]), s = try Self.number([]),
            inverse = try Self.number([]), exponent = try Self.number([])
        defer { for number in [nonce, r, s, inverse, exponent] { BN_clear_free(number) } }
        BN_set_flags(nonce, BN_FLG_CONSTTIME)
        // k⁻¹ = k^(n−2) mod n (Fermat): a constant-time exponentiation, where BN_mod_inverse is not.
        guard BN_sub(exponent, order, BN_value_one()) == 1, BN_sub(exponent, exponent, BN_value_one()) == 1 else {
            throw CryptoError(.signingFailed, "n - 2")
        }
        while true {
            v = HMACSHA256.authenticate(v, key: k)
            guard BN_bin2bn(v, 32, nonce) != nil else { throw CryptoError(.signingFailed, "nonce") }
            if BN_is_zero(nonce) == 0, BN_cmp(nonce, order) < 0 {
                // r = (k·G).x mod n; s = k⁻¹ (z + r·d) mod n.
                guard EC_POINT_mul(group, point, nonce, nil, nil, context) == 1,
                      EC_POINT_get_affine_coordinates(group, point, r, nil, context) == 1,
                      BN_nnmod(r, r, order, context) == 1,
                      BN_mod_exp_mont_consttime(inverse, nonce, exponent, order, context, nil) == 1,
                      BN_mod_mul(s, r, secret, order, context) == 1, BN_mod_add(s, s, z, order, context) == 1,
                      BN_mod_mul(s, s, inverse, order, context) == 1 else {
                    throw CryptoError(.signingFailed, "ECDSA arithmetic")
                }
                if BN_is_zero(r) == 0, BN_is_zero(s) == 0 { break }
            }
            // A nonce out of range (or a zero r or s, odds of 2⁻²⁵⁶): the next candidate, as RFC 6979 says.
            k = HMACSHA256.authenticate(v + [0x00], key: k)
            v = HMACSHA256.authenticate(v, key: k)
        }
        var signature = [UInt8](repeating: 0, count: 64)
        guard signature.withUnsafeMutableBufferPointer({ buffer in
            BN_bn2binpad(r, buffer.baseAddress, 32) == 32 && BN_bn2binpad(s, buffer.baseAddress! + 32, 32) == 32
        }) else { throw CryptoError(.signingFailed, "signature encoding") }
        return signature
    }

    /// A big-endian number (0 for no bytes), to free with `BN_free`.
    private static func number(_ bytes: [UInt8]) throws -> OpaquePointer {
        guard let number = BN_bin2bn(bytes, Int32(bytes.count), nil) else { throw CryptoError(.signingFailed, "BN_bin2bn") }
        return number
    }
}
