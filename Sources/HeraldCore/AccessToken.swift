import HeraldCrypto
import HeraldRuntime

/// An OAuth 2 access token accepted for Live Activity registration: a JWT signed by an app's issuer, for its
/// audience, unexpired, with a subject and the `activities:write` scope. Pure (the time is given), so the HTTP
/// layer only renders the refusals.
public struct AccessToken: Sendable {
    /// Why a token is refused, in the order the checks run.
    public enum Failure: Error, Equatable, Sendable {
        /// Malformed, unknown issuer, bad signature, wrong audience, expired, not yet valid or no subject (401).
        case invalid(String)
        /// The request names another app than the token's, existing or not (403).
        case otherApp(String)
        /// A valid token for the app without `activities:write` (403).
        case insufficientScope
    }

    public static let activitiesScope = "activities:write"

    /// The app whose issuer signed the token.
    public let app: App
    /// The token's `sub`: the user registrations belong to.
    public let subject: String

    /// Checks `token` against the issuers of `directory` at `now` (UNIX seconds), allowing `skew` seconds of
    /// clock difference on `exp` and `nbf`; `appID` is the app the request names, if any.
    public init(verifying token: String, directory: AppDirectory, appID: String?, now: Double,
                skew: Double) throws(Failure) {
        let jwt: JSONWebToken
        do { jwt = try JSONWebToken(parsing: token) } catch { throw .invalid("\(error)") }
        guard let issuer = jwt.stringClaim("iss"), let app = directory.app(forIssuer: issuer), let oauth = app.oauth else {
            throw .invalid("unknown issuer")
        }
        do { try jwt.verify(with: oauth.publicKey) } catch { throw .invalid("\(error)") }
        let audiences: [String] = switch jwt.claims["aud"] {
        case .string(let one): [one]
        case .array(let many): many.compactMap(\.stringValue)
        default: []
        }
        guard audiences.contains(oauth.audience) else { throw .invalid("wrong audience") }
        guard let expiry = jwt.numericClaim("exp") else { throw .invalid("no expiry") }
        guard expiry + skew > now else { throw .invalid("expired") }
        if let notBefore = jwt.numericClaim("nbf"), notBefore - skew > now { throw .invalid("not valid yet") }
        guard let subject = jwt.stringClaim("sub"), !subject.isEmpty else { throw .invalid("no subject") }
        if let appID, appID != app.id {
            throw .otherApp(appID)
        }
        let scopes = (jwt.stringClaim("scope")?.split(separator: " ").map(String.init) ?? [])
            + (jwt.claims["scp"]?.arrayValue?.compactMap(\.stringValue) ?? [])
        guard scopes.contains(Self.activitiesScope) else { throw .insufficientScope }
        (self.app, self.subject) = (app, subject)
    }
}
