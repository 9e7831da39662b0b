import HeraldCrypto
import HeraldFuzzSupport
import HeraldRuntime

/// JWT parsing and verification as ingest applies them to OAuth bearer tokens: a token parses into header and
/// claims or is refused as malformed; a token verifies only with the key of its `alg`, and any changed byte of
/// its signature breaks it. Seeds carry tokens the fixed keys signed, so the verifying path is reached.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let token = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    let jwt: JSONWebToken
    do { jwt = try JSONWebToken(parsing: token) } catch { return 0 }
    let parts = token.split(separator: ".", omittingEmptySubsequences: false)
    require(parts.count == 3 && jwt.signingInput == parts[0] + "." + parts[1], "signing input")
    _ = (jwt.stringClaim("iss"), jwt.stringClaim("sub"), jwt.numericClaim("exp"), jwt.numericClaim("nbf"))
    for key in [FuzzKeys.es256.publicKey, FuzzKeys.rsa.publicKey] {
        guard (try? jwt.verify(with: key)) != nil else { continue }
        require(jwt.algorithm == key.algorithm.rawValue, "verified with another algorithm's key")
        var forged = jwt.signature
        if forged.isEmpty { fatalError("invariant broken: an empty signature verified") }
        forged[forged.count - 1] ^= 0x01
        let tampered = jwt.signingInput + "." + Base64URL.encode(forged)
        require((try? JSONWebToken(parsing: tampered).verify(with: key)) == nil, "a changed signature verified")
    }
    return 0
}
