import Foundation
import HeraldRuntime

/// A compact-serialised JSON Web Token (JWS): signing for APNs provider tokens, parsing and signature
/// verification for OAuth 2 bearer tokens. Claim checks (iss, aud, exp, …) belong to the caller.
public struct JSONWebToken: Sendable {
    public enum Failure: Error, Equatable, CustomStringConvertible {
        case malformed(String)
        case algorithmNotAllowed(String)
        case badSignature

        public var description: String {
            switch self {
            case .malformed(let why): "malformed token: \(why)"
            case .algorithmNotAllowed(let alg): "algorithm \(alg) is not accepted"
            case .badSignature: "signature does not verify"
            }
        }
    }

    /// The decoded header and claims.
    public let header: [String: JSONValue]
    public let claims: [String: JSONValue]
    /// `base64url(header).base64url(claims)`: what the signature covers.
    public let signingInput: String
    public let signature: [UInt8]

    /// The `alg` header value, as sent.
    public var algorithm: String? { header["alg"]?.stringValue }

    /// Signs `claims` with `key`, header `{"alg", "typ"?, "kid"?}` in a fixed key order. `deterministic` (ES256
    /// only) makes the same key and claims give the same token everywhere (`PrivateKey.signDeterministically`).
    public static func sign(claims: [String: JSONValue], keyID: String?, key: PrivateKey,
                            type: String? = nil, deterministic: Bool = false) throws -> String {
        var header: [String: JSONValue] = ["alg": .string(key.algorithm.rawValue)]
        if let keyID { header["kid"] = .string(keyID) }
        if let type { header["typ"] = .string(type) }
        let headerPart = Base64URL.encode(JSONValue.object(header).encoded())
        let claimsPart = Base64URL.encode(JSONValue.object(claims).encoded())
        let signingInput = headerPart + "." + claimsPart
        let input = Array(signingInput.utf8)
        let signature = deterministic ? try key.signDeterministically(input) : try key.sign(input)
        return signingInput + "." + Base64URL.encode(signature)
    }

    /// Splits and decodes a token without checking its signature.
    public init(parsing token: String) throws(Failure) {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { throw .malformed("expected three dot-separated parts") }
        guard let headerBytes = Base64URL.decode(parts[0]), let claimBytes = Base64URL.decode(parts[1]),
              let signature = Base64URL.decode(parts[2]) else { throw .malformed("invalid base64url") }
        // The strict parser: a claim named twice (`sub`, `iss`) makes the token malformed, not ambiguous. A large
        // integer in a claim Herald never reads (an issuer's numeric user id) is no reason to refuse the token.
        guard case .object(let header)? = JSONValue(parsing: headerBytes, exactIntegers: false),
              case .object(let claims)? = JSONValue(parsing: claimBytes, exactIntegers: false) else {
            throw .malformed("header and claims must be JSON objects, each member named once")
        }
        self.header = header
        self.claims = claims
        self.signingInput = parts[0] + "." + parts[1]
        self.signature = signature
    }

    /// Checks the signature with `key`. The token's `alg` must equal the key's algorithm: `none`, HS256 and any
    /// algorithm other than the configured key's are refused (no algorithm confusion).
    public func verify(with key: PublicKey) throws(Failure) {
        guard let alg = algorithm, alg == key.algorithm.rawValue else {
            throw .algorithmNotAllowed(algorithm ?? "(missing)")
        }
        guard key.verify(signature, for: Array(signingInput.utf8)) else { throw .badSignature }
    }

    /// A claim as a number of seconds (JSON numbers only).
    public func numericClaim(_ name: String) -> Double? {
        claims[name]?.numberValue
    }

    public func stringClaim(_ name: String) -> String? { claims[name]?.stringValue }
}
