import Foundation
import HeraldCrypto
import HeraldRuntime

/// A provider token signing key the simulator trusts: the team, the key id and the public half of the `.p8`.
public struct ProviderKey: Sendable {
    /// The token's `iss`: the 10-character team id.
    public var teamID: String
    /// The token's `kid`: the 10-character key id.
    public var keyID: String
    /// Verifies the token's ES256 signature.
    public var publicKey: PublicKey

    public init(teamID: String, keyID: String, publicKey: PublicKey) {
        self.teamID = teamID
        self.keyID = keyID
        self.publicKey = publicKey
    }

    /// Reads `TEAMID:KEYID:PATH`, where PATH is a `.p8` private key, a public key or a certificate (PEM).
    public init(specification: String, relativeTo directory: String? = nil) throws(ConfigurationError) {
        let parts = specification.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, !parts[1].isEmpty, !parts[2].isEmpty else {
            throw ConfigurationError("key", "expected TEAMID:KEYID:PATH, got \"\(specification)\"")
        }
        try self.init(teamID: String(parts[0]), keyID: String(parts[1]), path: String(parts[2]),
                      relativeTo: directory)
    }

    /// Reads the key at `path` (a `.p8` private key, a public key or a certificate, PEM).
    public init(teamID: String, keyID: String, path: String, relativeTo directory: String? = nil)
        throws(ConfigurationError) {
        let resolved = directory.map { path.hasPrefix("/") ? path : $0 + "/" + path } ?? path
        guard let pem = try? String(contentsOfFile: resolved, encoding: .utf8) else {
            throw ConfigurationError("key", "cannot read \(resolved)")
        }
        let publicKey: PublicKey
        if let key = try? PrivateKey(pem: pem) {
            publicKey = key.publicKey
        } else if let key = try? PublicKey(pem: pem) {
            publicKey = key
        } else {
            throw ConfigurationError("key", "\(resolved) is not a PEM private key, public key or certificate")
        }
        guard publicKey.algorithm == .es256 else {
            throw ConfigurationError("key", "\(resolved) is not a P-256 (ES256) key")
        }
        self.init(teamID: teamID, keyID: keyID, publicKey: publicKey)
    }
}

/// A provider token whose signature verified, with the claims the connection rules need.
struct VerifiedToken: Sendable, Equatable {
    var token: String
    var teamID: String
    var keyID: String
    var issuedAt: Double
}

/// Checks `authorization: bearer <JWT>` as APNs does: ES256 with `kid`, `iss` and `iat`, signed by a key the
/// simulator was given, not older than an hour and not from the future; and one token per key for every
/// connection and sender: a token of a key that has another one issued less than `minimumInterval` apart (several
/// instances each signing their own) gets 429 TooManyProviderTokenUpdates.
///
/// Signatures are verified once per distinct token (tokens are meant to be reused for up to an hour, and ECDSA
/// verification costs ~100 µs); the age checks run on every request.
final class ProviderTokenVerifier: Sendable {
    private let keys: [String: ProviderKey]
    private let maximumAge: Double
    private let allowedSkew: Double
    private let minimumInterval: Double
    private let verified = Lock<[String: VerifiedToken]>([:])
    /// Per key (`team/key`), the distinct tokens accepted within the last `maximumAge`.
    private let issued = Lock<[String: [VerifiedToken]]>([:])
    private static let cacheLimit = 4096

    init(keys: [ProviderKey], maximumAge: Duration, allowedSkew: Duration, minimumInterval: Duration) {
        var byID: [String: ProviderKey] = [:]
        for key in keys { byID[key.teamID + "/" + key.keyID] = key }
        self.keys = byID
        self.maximumAge = maximumAge.inSeconds
        self.allowedSkew = allowedSkew.inSeconds
        self.minimumInterval = minimumInterval.inSeconds
    }

    func verify(authorization: String?, now: Double) -> Result<VerifiedToken, APNsRejection> {
        guard let authorization, !authorization.isEmpty else {
            return .failure(APNsRejection(403, "MissingProviderToken"))
        }
        let invalid = APNsRejection(403, "InvalidProviderToken")
        let utf8 = authorization.utf8
        guard utf8.count >= 7, let scheme = String(utf8.prefix(7)), scheme.lowercased() == "bearer ",
              let token = String(utf8.dropFirst(7).drop(while: { $0 == UInt8(ascii: " ") })) else {
            return .failure(invalid)
        }
        if token.isEmpty { return .failure(APNsRejection(403, "MissingProviderToken")) }

        let cached = verified.withLock { $0[token] }
        guard let known = cached ?? checkSignature(token) else { return .failure(invalid) }
        if known.issuedAt > now + allowedSkew { return .failure(invalid) }
        if now - known.issuedAt > maximumAge { return .failure(APNsRejection(403, "ExpiredProviderToken")) }
        if cached == nil {
            guard isOnlyTokenOfItsTime(known, now: now) else {
                return .failure(APNsRejection(429, "TooManyProviderTokenUpdates"))
            }
            verified.withLock { cache in
                if cache.count >= Self.cacheLimit { cache.removeAll(keepingCapacity: true) }
                cache[token] = known
            }
        }
        return .success(known)
    }

    /// False when the key has another live token issued less than `minimumInterval` before or after this one;
    /// else records it.
    private func isOnlyTokenOfItsTime(_ token: VerifiedToken, now: Double) -> Bool {
        issued.withLock { issued in
            let key = token.teamID + "/" + token.keyID
            var live = (issued[key] ?? []).filter { now - $0.issuedAt <= maximumAge }
            if live.contains(where: { $0.token != token.token && abs($0.issuedAt - token.issuedAt) < minimumInterval }) {
                return false
            }
            if !live.contains(where: { $0.token == token.token }) { live.append(token) }
            issued[key] = live
            return true
        }
    }

    private func checkSignature(_ token: String) -> VerifiedToken? {
        guard let jwt = try? JSONWebToken(parsing: token), jwt.algorithm == "ES256",
              let keyID = jwt.header["kid"]?.stringValue, let teamID = jwt.stringClaim("iss"),
              let issuedAt = jwt.numericClaim("iat"), issuedAt.isFinite,
              let key = keys[teamID + "/" + keyID] else { return nil }
        guard (try? jwt.verify(with: key.publicKey)) != nil else { return nil }
        return VerifiedToken(token: token, teamID: teamID, keyID: keyID, issuedAt: issuedAt)
    }
}

/// Apple's rules per connection: every token on it is of the team of the first one (403 UnrelatedKeyIdInToken
/// otherwise: one connection serves one team), and a connection that switches a key's token to one issued less
/// than `minimumInterval` after the token it replaces gets 429 TooManyProviderTokenUpdates (and keeps the old one).
struct ProviderTokenTracker {
    var minimumInterval: Double
    private var team: String?
    private var current: [String: VerifiedToken] = [:]

    init(minimumInterval: Duration) { self.minimumInterval = minimumInterval.inSeconds }

    /// Nil when this token may be used on the connection now; else Apple's answer.
    mutating func refusal(of token: VerifiedToken) -> APNsRejection? {
        if let team, team != token.teamID { return APNsRejection(403, "UnrelatedKeyIdInToken") }
        team = token.teamID
        let key = token.teamID + "/" + token.keyID
        guard let previous = current[key] else {
            current[key] = token
            return nil
        }
        if previous.token == token.token { return nil }
        guard token.issuedAt - previous.issuedAt >= minimumInterval else {
            return APNsRejection(429, "TooManyProviderTokenUpdates")
        }
        current[key] = token
        return nil
    }
}
