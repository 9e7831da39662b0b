import Foundation
import HeraldCrypto
import HeraldRuntime

/// APNs provider tokens (ES256 JWTs), one per (team id, key id, key), shared by every connection and request. The
/// key's fingerprint is part of the cache key, so a `.p8` replaced under the same key id (a reload) never reuses a
/// token the old key signed, and two apps that happen to share ids never share tokens.
///
/// A token is re-signed when older than `maximumAge`, and never sooner than `minimumInterval` after the previous
/// one, so APNs never sees a token per push (429 TooManyProviderTokenUpdates) nor one older than an hour (403
/// ExpiredProviderToken).
public final class APNsProviderTokenCache: Sendable {
    /// A signed token and when it was issued.
    public struct Token: Sendable, Equatable {
        public let value: String
        public let issuedAt: Date
    }

    private struct Key: Hashable {
        let teamID: String
        let keyID: String
        let fingerprint: String

        init(_ credentials: APNsCredentials) {
            (teamID, keyID, fingerprint) = (credentials.teamID, credentials.keyID, credentials.privateKey.fingerprint)
        }
    }

    private let tokens = Lock<[Key: Token]>([:])
    private let maximumAge: TimeInterval
    private let minimumInterval: TimeInterval
    private let now: @Sendable () -> Date
    private let signed: Counter

    /// - Parameters:
    ///   - now: the wall clock (injectable for tests).
    ///   - metrics: counts each signed token in `herald_apns_provider_token_refreshes_total`.
    public init(maximumAge: Duration = .seconds(50 * 60), minimumInterval: Duration = .seconds(20 * 60),
                now: @escaping @Sendable () -> Date = { Date() }, metrics: MetricsRegistry = .shared) {
        self.maximumAge = maximumAge.inSeconds
        self.minimumInterval = minimumInterval.inSeconds
        self.now = now
        signed = metrics.counter("herald_apns_provider_token_refreshes_total",
                                 help: "APNs provider tokens (JWTs) signed").labels()
    }

    /// The current token for `credentials`, signed when missing or older than the maximum age.
    public func token(for credentials: APNsCredentials) throws(APNsError) -> Token {
        let key = Key(credentials)
        let now = now()
        return try tokens.withLock { (all: inout [Key: Token]) throws(APNsError) -> Token in
            if let current = all[key], now.timeIntervalSince(current.issuedAt) < maximumAge {
                return current
            }
            let fresh = try sign(credentials, at: now)
            all[key] = fresh
            return fresh
        }
    }

    /// After APNs answered 403 ExpiredProviderToken to `rejected`: the token to retry with, or `nil` when the
    /// 20-minute rule forbids signing a new one yet. A token another request already replaced is not re-signed.
    public func token(afterRejecting rejected: Token, for credentials: APNsCredentials) throws(APNsError) -> Token? {
        let key = Key(credentials)
        let now = now()
        return try tokens.withLock { (all: inout [Key: Token]) throws(APNsError) -> Token? in
            if let current = all[key], current != rejected { return current }
            if let current = all[key], now.timeIntervalSince(current.issuedAt) < minimumInterval { return nil }
            let fresh = try sign(credentials, at: now)
            all[key] = fresh
            return fresh
        }
    }

    private func sign(_ credentials: APNsCredentials, at date: Date) throws(APNsError) -> Token {
        guard credentials.privateKey.algorithm == .es256 else {
            throw APNsError(.providerTokenFailure, "APNs key \(credentials.keyID) is not a P-256 (ES256) key")
        }
        let issuedAt = date.timeIntervalSince1970.rounded(.down)
        let claims: [String: JSONValue] = ["iss": .string(credentials.teamID), "iat": .number(issuedAt)]
        do {
            let value = try JSONWebToken.sign(claims: claims, keyID: credentials.keyID, key: credentials.privateKey)
            signed.increment()
            return Token(value: value, issuedAt: date)
        } catch {
            throw APNsError(.providerTokenFailure, "cannot sign provider token for key \(credentials.keyID): \(error)")
        }
    }
}
