import Foundation
import HeraldCrypto
import HeraldRuntime
import Testing

@Suite struct DigestTests {
    @Test func sha256MatchesKnownVector() {
        #expect(Hex.encode(SHA256.hash("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    }

    @Test func hexRoundTripsAndRejectsBadInput() {
        #expect(Hex.decode("00ffAb") == [0, 255, 171])
        #expect(Hex.decode("abc") == nil)
        #expect(Hex.decode("zz") == nil)
        #expect(Hex.encode([0, 255, 171]) == "00ffab")
    }

    @Test func base64URLHasNoPaddingAndRoundTrips() {
        for length in 0..<8 {
            let bytes = (0..<length).map { UInt8(truncatingIfNeeded: $0 * 37 + 250) }
            let text = Base64URL.encode(bytes)
            #expect(!text.contains("=") && !text.contains("+") && !text.contains("/"))
            #expect(Base64URL.decode(text) == bytes)
        }
        #expect(Base64URL.decode("a") == nil)
    }

    @Test func constantTimeEquality() {
        #expect(ConstantTime.equals([1, 2, 3], [1, 2, 3]))
        #expect(!ConstantTime.equals([1, 2, 3], [1, 2, 4]))
        #expect(!ConstantTime.equals([1, 2], [1, 2, 3]))
    }

    @Test func randomHexIsFreshEachTime() {
        let a = SecureRandom.hex(12), b = SecureRandom.hex(12)
        #expect(a.count == 24 && a != b)
    }

    @Test func redactionHidesTheSecret() {
        let token = String(repeating: "ab", count: 32)
        let tag = Redaction.tag(token)
        #expect(tag.hasPrefix("sha256:") && tag.count == 19 && !tag.contains(token.prefix(8)))
        #expect(tag == Redaction.tag(token))
    }
}

@Suite struct SignatureTests {
    @Test(arguments: [SignatureAlgorithm.es256, .rs256])
    func signAndVerifyRoundTrip(algorithm: SignatureAlgorithm) throws {
        let key = algorithm == .es256 ? try PrivateKey.generateP256() : try PrivateKey.generateRSA()
        let reloaded = try PrivateKey(pem: key.pem)
        let message = Array("hello".utf8)
        let signature = try reloaded.sign(message)
        if algorithm == .es256 { #expect(signature.count == 64) }
        #expect(key.publicKey.verify(signature, for: message))
        #expect(!key.publicKey.verify(signature, for: Array("hellO".utf8)))
        let other = algorithm == .es256 ? try PrivateKey.generateP256() : try PrivateKey.generateRSA()
        #expect(!other.publicKey.verify(signature, for: message))
    }

    /// RFC 6979, appendix A.2.5 (P-256, SHA-256): the nonce, hence the signature, is the standard's to the bit.
    @Test func deterministicSignaturesMatchRFC6979() throws {
        let scalar = Hex.decode("C9AFA9D845BA75166B5C215767B1D6934E50C3DB36E89B127B8A622B120F6721".lowercased())!
        // SEC 1 ECPrivateKey { version 1, privateKey, parameters prime256v1 }; OpenSSL derives the public key.
        let der: [UInt8] = [0x30, 0x31, 0x02, 0x01, 0x01, 0x04, 0x20] + scalar
            + [0xA0, 0x0A, 0x06, 0x08, 0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x03, 0x01, 0x07]
        let key = try PrivateKey(pem: "-----BEGIN EC PRIVATE KEY-----\n\(Data(der).base64EncodedString())\n-----END EC PRIVATE KEY-----\n")
        let vectors = [
            ("sample", "EFD48B2AACB6A8FD1140DD9CD45E81D69D2C877B56AAF991C34D0EA84EAF3716"
                + "F7CB1C942D657C41D436C7A1B6E29F65F3E900DBB9AFF4064DC4AB2F843ACDA8"),
            ("test", "F1ABB023518351CD71D881567B1EA663ED3EFCF6C5132B354F28D3B0B7D38367"
                + "019F4113742A2B14BD25926B49C649155F267E60D3814B4C0CC84250E46F0083"),
        ]
        for (message, expected) in vectors {
            let signature = try key.signDeterministically(Array(message.utf8))
            #expect(Hex.encode(signature) == expected.lowercased(), "\(message)")
            #expect(key.publicKey.verify(signature, for: Array(message.utf8)))
        }
        // Any key: the same message signs the same way twice, and verifies.
        let fresh = try PrivateKey.generateP256()
        let once = try fresh.signDeterministically(Array("claims".utf8))
        #expect(try fresh.signDeterministically(Array("claims".utf8)) == once)
        #expect(try PrivateKey(pem: fresh.pem).signDeterministically(Array("claims".utf8)) == once)
        #expect(fresh.publicKey.verify(once, for: Array("claims".utf8)))
        #expect(throws: CryptoError.self) { try PrivateKey.generateRSA().signDeterministically([1]) }
    }

    @Test func rejectsGarbageKeys() {
        #expect(throws: CryptoError.self) { try PrivateKey(pem: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n") }
        #expect(throws: CryptoError.self) { try PublicKey(pem: "not a key") }
    }

    /// Interoperability: a key and signature made by the openssl command line verify here, and ours verify there.
    /// A secp256k1 key has 256 bits too, but APNs and ES256 mean P-256 only; RSA shorter than 2048 bits is weak.
    @Test func otherCurvesAndShortRSAKeysAreRefused() {
        let secp256k1 = """
            -----BEGIN PRIVATE KEY-----
            MIGEAgEAMBAGByqGSM49AgEGBSuBBAAKBG0wawIBAQQgsYo8WSrkDhgkXBPdh9tO
            uVa6EEnl/93Qt+hvKRP1oK+hRANCAASF2XBMXEkAjbw0BU12HHizsfex60u2k8rb
            LOtzC6IQPN27V8lBWhwvjHGsUWyLJJWdBP8AO6iP2zGvzr/l/aTS
            -----END PRIVATE KEY-----

            """
        #expect { try PrivateKey(pem: secp256k1) } throws: { ($0 as? CryptoError)?.code == .unsupportedKey }
        #expect { try PrivateKey.generateRSA(bits: 1024) } throws: { ($0 as? CryptoError)?.code == .unsupportedKey }
        #expect((try? PrivateKey.generateRSA(bits: 2048))?.algorithm == .rs256)
    }

    @Test func interoperatesWithTheOpenSSLCommandLine() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("herald-crypto-\(SecureRandom.hex(4))")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let keyPath = dir.appendingPathComponent("key.p8").path
        try run("openssl", ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", keyPath])
        let key = try PrivateKey(pem: String(contentsOfFile: keyPath, encoding: .utf8))
        #expect(key.algorithm == .es256)

        // A public key exported by openssl verifies our raw r‖s signature; openssl's own DER form must not pass.
        let messagePath = dir.appendingPathComponent("message").path
        try Data("interop".utf8).write(to: URL(fileURLWithPath: messagePath))
        let publicPath = dir.appendingPathComponent("public.pem").path
        try run("openssl", ["pkey", "-in", keyPath, "-pubout", "-out", publicPath])
        let publicKey = try PublicKey(pem: String(contentsOfFile: publicPath, encoding: .utf8))
        #expect(publicKey.verify(try key.sign(Array("interop".utf8)), for: Array("interop".utf8)))
        let signaturePath = dir.appendingPathComponent("sig.der").path
        try run("openssl", ["dgst", "-sha256", "-sign", keyPath, "-out", signaturePath, messagePath])
        let der = Array(try Data(contentsOf: URL(fileURLWithPath: signaturePath)))
        #expect(!publicKey.verify(der, for: Array("interop".utf8)), "JWS needs raw r‖s; DER must not pass")

        // RSA: openssl's PKCS#1 v1.5 SHA-256 signature verifies with our RS256 verifier.
        let rsaPath = dir.appendingPathComponent("rsa.pem").path
        try run("openssl", ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", rsaPath])
        try run("openssl", ["dgst", "-sha256", "-sign", rsaPath, "-out", signaturePath, messagePath])
        let rsa = try PrivateKey(pem: String(contentsOfFile: rsaPath, encoding: .utf8))
        let rsaSignature = Array(try Data(contentsOf: URL(fileURLWithPath: signaturePath)))
        #expect(rsa.publicKey.verify(rsaSignature, for: Array("interop".utf8)))
        #expect(try rsa.sign(Array("interop".utf8)) == rsaSignature, "PKCS#1 v1.5 is deterministic")
    }

    private func run(_ tool: String, _ arguments: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [tool] + arguments
        process.standardError = FileHandle.nullDevice
        try process.run()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0, "\(tool) \(arguments.joined(separator: " ")) failed")
    }
}

@Suite struct JSONWebTokenTests {
    @Test func signsParsesAndVerifiesES256() throws {
        let key = try PrivateKey.generateP256()
        let token = try JSONWebToken.sign(claims: ["iss": .string("TEAM123456"), "iat": .number(1_700_000_000)],
                                          keyID: "KEY1234567", key: key)
        let parsed = try JSONWebToken(parsing: token)
        #expect(parsed.algorithm == "ES256")
        #expect(parsed.header["kid"] == .string("KEY1234567"))
        #expect(parsed.numericClaim("iat") == 1_700_000_000)
        #expect(parsed.signature.count == 64)
        try parsed.verify(with: key.publicKey)
        // `iat` must be a JSON number on the wire.
        let claimsJSON = String(decoding: Base64URL.decode(token.split(separator: ".")[1])!, as: UTF8.self)
        #expect(claimsJSON.contains("\"iat\":1700000000"))
    }

    @Test func refusesAlgNoneAndAlgorithmConfusion() throws {
        let key = try PrivateKey.generateP256()
        let header = Base64URL.encode(Array(#"{"alg":"none"}"#.utf8))
        let claims = Base64URL.encode(Array(#"{"sub":"u"}"#.utf8))
        let unsigned = try JSONWebToken(parsing: "\(header).\(claims).")
        #expect(throws: JSONWebToken.Failure.algorithmNotAllowed("none")) { try unsigned.verify(with: key.publicKey) }

        let rsa = try PrivateKey.generateRSA()
        let rsToken = try JSONWebToken(parsing: try JSONWebToken.sign(claims: ["sub": .string("u")], keyID: nil, key: rsa))
        #expect(throws: JSONWebToken.Failure.algorithmNotAllowed("RS256")) { try rsToken.verify(with: key.publicKey) }
        try rsToken.verify(with: rsa.publicKey)
    }

    @Test func detectsTamperingAndMalformedTokens() throws {
        let key = try PrivateKey.generateP256()
        let token = try JSONWebToken.sign(claims: ["sub": .string("alice")], keyID: nil, key: key)
        let parts = token.split(separator: ".")
        let forged = Base64URL.encode(Array(#"{"sub":"mallory"}"#.utf8))
        let tampered = try JSONWebToken(parsing: "\(parts[0]).\(forged).\(parts[2])")
        #expect(throws: JSONWebToken.Failure.badSignature) { try tampered.verify(with: key.publicKey) }
        #expect(throws: JSONWebToken.Failure.self) { try JSONWebToken(parsing: "a.b") }
        #expect(throws: JSONWebToken.Failure.self) { try JSONWebToken(parsing: "!!.e30.") }
    }
}
