import Foundation
import HeraldCrypto
import HeraldRuntime

/// A shared secret read from a file (a Kubernetes Secret): the file's bytes with surrounding whitespace trimmed.
/// Never logged, never written to Redis or Kafka.
public struct SharedSecret: Sendable {
    /// Shorter secrets are refused: an HMAC key is only as strong as it is long.
    public static let minimumBytes = 16

    let bytes: [UInt8]

    public init(bytes: some Collection<UInt8>) throws(ConfigurationError) {
        let whitespace: Set<UInt8> = [0x20, 0x09, 0x0a, 0x0d]
        let trimmed = Array(bytes.drop { whitespace.contains($0) }.reversed().drop { whitespace.contains($0) }.reversed())
        guard trimmed.count >= Self.minimumBytes else {
            throw ConfigurationError("secret", "must be at least \(Self.minimumBytes) bytes (have \(trimmed.count))")
        }
        self.bytes = trimmed
    }

    public init(path: String) throws(ConfigurationError) {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ConfigurationError(path, "cannot read the secret file")
        }
        do { try self.init(bytes: data) } catch { throw ConfigurationError(path, error.message) }
    }

    /// A new random secret as the text to store in its file (`heraldctl keys new-secret`, the local stack).
    public static func generateText() -> String { Base64URL.encode(SecureRandom.bytes(32)) }

    func authenticate(_ message: [UInt8]) -> [UInt8] { HMACSHA256.authenticate(message, key: bytes) }
}

/// The `herald-signature` header every job record carries: `v1=<lowercase hex HMAC-SHA256 of the record value>`.
/// Herald's own writers sign with the deployment's secret, a direct producer with one of its app's secrets.
public enum JobSignature {
    public static let header = "herald-signature"

    /// The header's value for `record` signed with `secret`.
    public static func value(for record: [UInt8], secret: SharedSecret) -> [UInt8] {
        Array("v1=".utf8) + Array(Hex.encode(secret.authenticate(record)).utf8)
    }

    /// The header to add to a record written with `secret`.
    public static func headers(for record: [UInt8], secret: SharedSecret) -> [(String, [UInt8])] {
        [(header, value(for: record, secret: secret))]
    }

    /// True when exactly one `herald-signature` header is present and one of `secrets` made it.
    public static func verifies(_ headers: [(name: String, value: [UInt8])], record: [UInt8],
                                secrets: [SharedSecret]) -> Bool {
        let signatures = headers.filter { $0.name == header }
        guard signatures.count == 1, let presented = parse(signatures[0].value) else { return false }
        // Every secret is tried, so the time taken says nothing about which one matched.
        var matched = false
        for secret in secrets where ConstantTime.equals(secret.authenticate(record), presented) { matched = true }
        return matched
    }

    private static func parse(_ value: [UInt8]) -> [UInt8]? {
        let prefix = Array("v1=".utf8)
        guard value.count == prefix.count + 64, value.starts(with: prefix) else { return nil }
        let hex = value.dropFirst(prefix.count)
        // Lowercase only, as specified: one signature has one spelling.
        guard hex.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }) else { return nil }
        return Hex.decode(String(decoding: hex, as: UTF8.self))
    }
}

/// Whether job records are signed and checked (`HERALD_JOB_SIGNING_SECRET_FILE`), or, only when asked for with
/// `HERALD_JOB_SIGNATURES=unverified`, neither.
public enum JobSigning: Sendable {
    case signed(SharedSecret)
    case unverified

    /// Reads the two variables; without a secret file and without the opt-out it throws, so the process exits 2.
    public init(_ env: EnvironmentReader) throws {
        let mode = env.optionalString("HERALD_JOB_SIGNATURES")
        guard mode == nil || mode == "unverified" else {
            throw ConfigurationError("HERALD_JOB_SIGNATURES", "must be unverified or unset")
        }
        if let path = env.optionalString("HERALD_JOB_SIGNING_SECRET_FILE") {
            guard mode == nil else {
                throw ConfigurationError("HERALD_JOB_SIGNATURES", "unverified contradicts HERALD_JOB_SIGNING_SECRET_FILE")
            }
            do { self = .signed(try SharedSecret(path: path)) } catch {
                throw ConfigurationError("HERALD_JOB_SIGNING_SECRET_FILE", error.message)
            }
        } else if mode == "unverified" {
            self = .unverified
        } else {
            throw ConfigurationError("HERALD_JOB_SIGNING_SECRET_FILE",
                                     "is required (a file holding the deployment's job-signing secret); "
                                         + "set HERALD_JOB_SIGNATURES=unverified to run without signatures")
        }
    }

    /// The headers for a record this process writes: the signature, or none when unverified.
    public func headers(for record: [UInt8]) -> [(String, [UInt8])] {
        guard case .signed(let secret) = self else { return [] }
        return JobSignature.headers(for: record, secret: secret)
    }

    /// Logged once at start when signatures are off.
    public static let unverifiedWarning =
        "HERALD_JOB_SIGNATURES=unverified: job records are neither signed nor checked; anyone who can write to the jobs topic can push as any app"
}
