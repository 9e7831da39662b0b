import HeraldCore
import HeraldCrypto
import HeraldFuzzSupport
import HeraldRuntime

/// OAuth bearer tokens as ingest checks them: JWT parsing and signature verification, then `AccessToken`'s
/// claim rules for app `app1` (RS256 issuer `https://auth.example.com`, audience `herald`) at a fixed time. A token
/// is accepted only if its signature verifies with its issuer's key, for the audience, unexpired, with a subject;
/// any changed signature byte breaks it. Seeds carry tokens the fixed keys signed, so the accepting path is reached.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let token = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    let (now, skew) = (1_800_000_000.0, 60.0)
    let access = Result { () throws(AccessToken.Failure) in
        try AccessToken(verifying: token, directory: FuzzKeys.directory, appID: nil, now: now, skew: skew)
    }
    let jwt: JSONWebToken
    do { jwt = try JSONWebToken(parsing: token) } catch {
        require((try? access.get()) == nil, "a malformed token was accepted")
        return 0
    }
    let parts = token.split(separator: ".", omittingEmptySubsequences: false)
    require(parts.count == 3 && jwt.signingInput == parts[0] + "." + parts[1], "signing input")
    for key in [FuzzKeys.es256.publicKey, FuzzKeys.rsa.publicKey] {
        guard (try? jwt.verify(with: key)) != nil else { continue }
        require(jwt.algorithm == key.algorithm.rawValue, "verified with another algorithm's key")
        var forged = jwt.signature
        if forged.isEmpty { fatalError("invariant broken: an empty signature verified") }
        forged[forged.count - 1] ^= 0x01
        let tampered = jwt.signingInput + "." + Base64URL.encode(forged)
        require((try? JSONWebToken(parsing: tampered).verify(with: key)) == nil, "a changed signature verified")
    }
    if let accepted = try? access.get() {
        require(accepted.app.id == "app1" && !accepted.subject.isEmpty, "accepted for \(accepted.app.id)")
        require((try? jwt.verify(with: FuzzKeys.rsa.publicKey)) != nil, "accepted without the issuer's signature")
        require((jwt.numericClaim("exp") ?? -.infinity) + skew > now, "accepted an expired token")
        do {
            _ = try AccessToken(verifying: token, directory: FuzzKeys.directory, appID: "app2", now: now, skew: skew)
            fatalError("invariant broken: a token of app1 was let into app2")
        } catch {
            require(error == .otherApp("app2"), "app2 refused with \(error)")
        }
    }
    return 0
}
