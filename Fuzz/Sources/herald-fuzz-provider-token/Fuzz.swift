import HeraldCrypto
import HeraldFuzzSupport
@testable import HeraldAPNsSimulator

/// The APNs simulator's provider-token check: any `authorization` header value is accepted (ES256, known
/// team and key, fresh) or refused with APNs' 403 reason, never a crash; a fresh verifier per input so its cache
/// makes no run depend on an earlier one, and a second check of the same value (from the cache) agrees.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let header = String(decoding: UnsafeBufferPointer(start: data, count: size), as: UTF8.self)
    let verifier = ProviderTokenVerifier(keys: [ProviderKey(teamID: "TEAM123456", keyID: "KEY1234567",
                                                            publicKey: FuzzKeys.es256.publicKey)],
                                         maximumAge: .seconds(3600), allowedSkew: .seconds(60),
                                         minimumInterval: .seconds(1200))
    let now = 1_800_000_000.0
    let first = verifier.verify(authorization: header, now: now)
    switch first {
    case .success(let token):
        require(token.teamID == "TEAM123456" && token.keyID == "KEY1234567", "verified for an unknown key")
        require(token.issuedAt <= now + 60 && now - token.issuedAt <= 3600, "accepted a stale token")
    case .failure(let rejection):
        require(rejection.status == 403, "refused with \(rejection.status)")
    }
    require(verifier.verify(authorization: header, now: now) == first, "the cached answer differs")
    return 0
}
