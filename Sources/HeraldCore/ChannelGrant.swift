import HeraldCrypto
import HeraldRuntime

/// Permission to subscribe to a private channel (one under an app's `privateChannelPrefixes`): a short-lived JWT
/// the app's backend issues, HS256 with the app's grant secret (`channelGrantSecretPath`). Claims: `app` (the app
/// id), `exp` (required, at most 24 h ahead) and `channel` (one exact name) or `channels` (exact names, or
/// prefixes ending in `*`). Pure (the time is given), so the HTTP layer only renders the refusals.
public enum ChannelGrant {
    public static let maximumLifetime: Double = 86_400

    /// Why a grant does not let the caller subscribe (403 `invalid_channel_grant`).
    public struct Refusal: Error, Equatable, CustomStringConvertible {
        public var reason: String
        public var description: String { reason }
    }

    /// Checks that `token` grants `channel` of `app` at `now` (UNIX seconds), allowing `skew` seconds of clock
    /// difference.
    public static func check(_ token: String, channel: String, app: App, now: Double, skew: Double) throws(Refusal) {
        guard let secret = app.channelGrantSecret else { throw Refusal(reason: "the app issues no channel grants") }
        let jwt: JSONWebToken
        do { jwt = try JSONWebToken(parsing: token) } catch { throw Refusal(reason: "\(error)") }
        // HS256 only: `none` and every public-key algorithm are refused (no algorithm confusion).
        guard jwt.algorithm == "HS256" else { throw Refusal(reason: "algorithm \(jwt.algorithm ?? "(missing)") is not HS256") }
        guard ConstantTime.equals(secret.authenticate(Array(jwt.signingInput.utf8)), jwt.signature) else {
            throw Refusal(reason: "signature does not verify")
        }
        guard jwt.stringClaim("app") == app.id else { throw Refusal(reason: "the grant is not for app \(app.id)") }
        guard let expiry = jwt.numericClaim("exp") else { throw Refusal(reason: "no expiry (exp)") }
        guard expiry + skew > now else { throw Refusal(reason: "expired") }
        guard expiry <= now + maximumLifetime + skew else { throw Refusal(reason: "exp is more than 24 h ahead") }
        if let notBefore = jwt.numericClaim("nbf"), notBefore - skew > now { throw Refusal(reason: "not valid yet") }
        guard grants(jwt.claims, channel: channel) else { throw Refusal(reason: "the grant does not cover this channel") }
    }

    /// Names are compared as UTF-8 bytes, as Redis keys the channel: String's `==` and `hasPrefix` take two
    /// spellings of one text (`é` and `e` with a combining accent) for the same, and they are two channels.
    private static func grants(_ claims: [String: JSONValue], channel: String) -> Bool {
        let name = channel.utf8
        if let one = claims["channel"]?.stringValue, one.utf8.elementsEqual(name) { return true }
        for entry in claims["channels"]?.arrayValue ?? [] {
            guard let pattern = entry.stringValue?.utf8, !pattern.isEmpty else { continue }
            if pattern.last == UInt8(ascii: "*") ? name.starts(with: pattern.dropLast()) : pattern.elementsEqual(name) {
                return true
            }
        }
        return false
    }

    /// A grant signed with `secret` (tests, and what an app's backend does in its own language).
    public static func sign(claims: [String: JSONValue], secret: SharedSecret) -> String {
        let header = Base64URL.encode(JSONValue.object(["alg": .string("HS256"), "typ": .string("JWT")]).encoded())
        let input = header + "." + Base64URL.encode(JSONValue.object(claims).encoded())
        return input + "." + Base64URL.encode(secret.authenticate(Array(input.utf8)))
    }
}
