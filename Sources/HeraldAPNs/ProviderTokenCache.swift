import Foundation
import HeraldCrypto
import HeraldRuntime

/// APNs provider tokens (ES256 JWTs), one per (team id, key id, key), shared by every connection and request. The
/// key's fingerprint is part of the cache key, so a `.p8` replaced under the same key id (a reload) never reuses a
/// token the old key signed, and two apps that happen to share ids never share tokens.
///
/// Apple wants one token per key, shared by every connection and worker, renewed no more than once every 20
/// minutes and no less than once an hour. Processes share theirs without talking to each other: a token's `iat` is
/// the start of its `window` (windows are aligned on the Unix epoch, and one is taken up a minute after it starts,
/// so a clock a little behind never sees an `iat` from the future), and its signature is deterministic (RFC 6979),
/// so every dispatcher pod and `heraldctl send --direct` compute the very same token, and APNs sees it change once
/// per window (429 TooManyProviderTokenUpdates is what pods each signing their own get).
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

    /// APNs refuses a token an hour old; a kept token is replaced a few minutes before.
    private static let maximumAge: TimeInterval = 55 * 60
    /// How far behind now every `iat` is at least, so a clock a little ahead of Apple's never sends one from the future.
    private static let clockMargin: TimeInterval = 60
    private let tokens = Lock<[Key: Token]>([:])
    private let window: TimeInterval
    private let minimumInterval: TimeInterval
    private let now: @Sendable () -> Date
    private let signed: Counter

    /// - Parameters:
    ///   - window: how long one token is used; between `minimumInterval` and 58 minutes (a window's token is at most a
    ///     window and a minute old).
    ///   - now: the wall clock (injectable for tests).
    ///   - metrics: counts each signed token in `herald_apns_provider_token_refreshes_total`.
    public init(window: Duration = .seconds(30 * 60), minimumInterval: Duration = .seconds(20 * 60),
                now: @escaping @Sendable () -> Date = { Date() }, metrics: MetricsRegistry = .shared) {
        self.minimumInterval = minimumInterval.inSeconds
        self.window = min(max(window.inSeconds, self.minimumInterval, 60), 58 * 60).rounded(.down)
        self.now = now
        signed = metrics.counter("herald_apns_provider_token_refreshes_total",
                                 help: "APNs provider tokens (JWTs) signed").labels()
    }

    /// The current window's token for `credentials`. A token re-signed after a rejection (issued inside a window)
    /// is kept, even into later windows, until a window starts `minimumInterval` after it: APNs compares issue
    /// times, so a window's token issued sooner after it would be one update too many. It is replaced anyway
    /// once it is `maximumAge` old, short of the hour after which APNs refuses it.
    public func token(for credentials: APNsCredentials) throws(APNsError) -> Token {
        let key = Key(credentials)
        let now = now()
        let windowStart = ((now.timeIntervalSince1970 - Self.clockMargin) / window).rounded(.down) * window
        return try tokens.withLock { (all: inout [Key: Token]) throws(APNsError) -> Token in
            if let current = all[key] {
                let issued = current.issuedAt.timeIntervalSince1970
                if issued >= windowStart { return current }
                if windowStart - issued < minimumInterval, now.timeIntervalSince1970 - issued < Self.maximumAge {
                    return current
                }
            }
            // A kept token replaced for its age: its successor is still issued 20 minutes after it.
            let issuedAt = all[key].map { max(windowStart, $0.issuedAt.timeIntervalSince1970 + minimumInterval) } ?? windowStart
            let fresh = try sign(credentials, issuedAt: issuedAt)
            all[key] = fresh
            return fresh
        }
    }

    /// After APNs answered 403 ExpiredProviderToken to `rejected`: the token to retry with, or `nil` when the
    /// 20-minute rule forbids signing a new one yet. A token another request already replaced is not re-signed.
    /// The new token's `iat` is the start of the five minutes a minute ago was in (but at least `minimumInterval`
    /// after the rejected one's), so pods refused the same token within those minutes sign the very same new one.
    public func token(afterRejecting rejected: Token, for credentials: APNsCredentials) throws(APNsError) -> Token? {
        let key = Key(credentials)
        let issuable = now().timeIntervalSince1970 - Self.clockMargin // the latest `iat` to sign now
        return try tokens.withLock { (all: inout [Key: Token]) throws(APNsError) -> Token? in
            if let current = all[key], current != rejected { return current }
            if let current = all[key], issuable - current.issuedAt.timeIntervalSince1970 < minimumInterval { return nil }
            let fiveMinutes = (issuable / 300).rounded(.down) * 300
            let fresh = try sign(credentials, issuedAt: max(fiveMinutes,
                                                            rejected.issuedAt.timeIntervalSince1970 + minimumInterval))
            all[key] = fresh
            return fresh
        }
    }

    private func sign(_ credentials: APNsCredentials, issuedAt: TimeInterval) throws(APNsError) -> Token {
        guard credentials.privateKey.algorithm == .es256 else {
            throw APNsError(.providerTokenFailure, "APNs key \(credentials.keyID) is not a P-256 (ES256) key")
        }
        let claims: [String: JSONValue] = ["iss": .string(credentials.teamID), "iat": .number(issuedAt)]
        do {
            let value = try JSONWebToken.sign(claims: claims, keyID: credentials.keyID, key: credentials.privateKey,
                                              deterministic: true)
            signed.increment()
            return Token(value: value, issuedAt: Date(timeIntervalSince1970: issuedAt))
        } catch {
            throw APNsError(.providerTokenFailure, "cannot sign provider token for key \(credentials.keyID): \(error)")
        }
    }
}
