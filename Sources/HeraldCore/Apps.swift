import Foundation
import HeraldCrypto
import HeraldRuntime

/// The kind of an API key: public keys are for devices, secret keys for producers (and devices).
public enum APIKeyKind: String, Sendable, Codable {
    case `public`
    case secret

    /// The prefix of every key of this kind.
    public var prefix: String { self == .public ? "hrd_pub_" : "hrd_sec_" }
}

/// An app Herald sends for: its API keys (as SHA-256 only), APNs provider key and optional OAuth issuer.
public struct App: Sendable {
    public struct Key: Sendable {
        public var kind: APIKeyKind
        /// Lowercase hex SHA-256 of the key.
        public var sha256: String
        /// The user a device key acts for (Live Activity registrations); `default` when absent.
        public var user: String?
    }

    public struct APNs: Sendable {
        public var teamId: String
        public var keyId: String
        public var bundleId: String
        /// Loaded only by processes that send (`AppDirectory.Reader.dispatcher`): herald-ingest signs nothing.
        public var privateKey: PrivateKey?
    }

    public struct OAuth: Sendable {
        public var issuer: String
        public var audience: String
        public var publicKey: PublicKey
    }

    public var id: String
    public var keys: [Key]
    public var apns: APNs
    public var oauth: OAuth?
    /// Secrets this app's own producers sign job records with (`jobSigningSecretPaths`; the first signs, any
    /// verifies). Loaded by the dispatcher only.
    public var jobSigningSecrets: [SharedSecret] = []
    /// Channels whose names start with one of these need a channel grant to subscribe to.
    public var privateChannelPrefixes: [String] = []
    /// The HS256 key of this app's channel grants (`channelGrantSecretPath`); loaded by herald-ingest only.
    public var channelGrantSecret: SharedSecret?

    /// True when subscribing to `channel` needs a channel grant. Compared as UTF-8 bytes, as Redis keys the
    /// channel: `hasPrefix` compares characters, so `user:` followed by a combining mark would not start with `user:`.
    public func isPrivate(channel: String) -> Bool {
        privateChannelPrefixes.contains { channel.utf8.starts(with: $0.utf8) }
    }

    /// True when `bundleID` is the app's bundle id or one of its extensions (`<bundleId>.<suffix>`).
    ///
    /// Compared as UTF-8 bytes, without building `<bundleId>.` per call (every registration asks): bundle ids are
    /// ASCII, where bytes and characters agree.
    public func owns(bundleID: String) -> Bool {
        let own = apns.bundleId.utf8, candidate = bundleID.utf8
        guard candidate.starts(with: own) else { return false }
        let rest = candidate.dropFirst(own.count)
        return rest.isEmpty || rest.first == UInt8(ascii: ".")
    }
}

/// An authenticated caller: the app whose key it presented, and the key's kind and user.
public struct Principal: Sendable, Equatable {
    public var appID: String
    public var kind: APIKeyKind
    public var user: String
    /// What rate limits count against: the key's hash, or a hash of app and `sub` for OAuth tokens.
    public var rateLimitKey: String
    /// True for a public API key: one credential shared by every installed copy of the app, so its rate limit
    /// counts per device.
    public var isSharedByDevices: Bool

    public init(appID: String, kind: APIKeyKind, user: String, rateLimitKey: String, isSharedByDevices: Bool = false) {
        (self.appID, self.kind, self.user, self.rateLimitKey, self.isSharedByDevices) =
            (appID, kind, user, rateLimitKey, isSharedByDevices)
    }
}

/// The apps file (`HERALD_APPS_FILE`), parsed, checked and with its keys loaded.
public struct AppDirectory: Sendable {
    public let apps: [String: App]
    private let keysByHash: [String: (appID: String, key: App.Key)]
    private let appsByIssuer: [String: String]
    /// Keys this directory authenticated lately. Per directory, so a reload starts afresh.
    private let recentKeys = RecentKeys()

    /// Which process reads the apps file: each loads only the key material it uses.
    public enum Reader: Sendable {
        /// herald-ingest: channel-grant secrets, never an APNs private key or a job-signing secret.
        case ingest
        /// herald-dispatcher: APNs private keys and job-signing secrets.
        case dispatcher
    }

    /// Reads and checks the apps file; key paths are relative to the file's folder.
    public static func load(path: String, for reader: Reader = .dispatcher) throws -> AppDirectory {
        let url = URL(fileURLWithPath: path)
        let data: Data
        do { data = try Data(contentsOf: url) } catch {
            throw AppsFileError("cannot read \(path): \(error.localizedDescription)")
        }
        let folder = url.deletingLastPathComponent().path
        return try parse(data, for: reader) { relative in
            let full = relative.hasPrefix("/") ? relative : folder + "/" + relative
            guard let text = try? String(contentsOfFile: full, encoding: .utf8) else {
                throw AppsFileError("cannot read key file \(relative)")
            }
            return text
        }
    }

    /// Parses apps-file JSON; `readFile` returns the text of a key file named in it.
    public static func parse(_ data: Data, for reader: Reader = .dispatcher,
                             readFile: (String) throws -> String) throws -> AppDirectory {
        let file: AppsFile
        do { file = try JSONDecoder().decode(AppsFile.self, from: data) } catch {
            throw AppsFileError("not a valid apps file: \(describe(error))")
        }
        var apps: [String: App] = [:]
        var keysByHash: [String: (appID: String, key: App.Key)] = [:]
        var appsByIssuer: [String: String] = [:]
        for entry in file.apps {
            guard !entry.id.isEmpty, entry.id.utf8.count <= 64,
                  entry.id.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "-_.".contains($0)) }) else {
                throw AppsFileError("app id \"\(entry.id)\" must be 1–64 letters, digits, '-', '_' or '.'")
            }
            guard apps[entry.id] == nil else { throw AppsFileError("app \(entry.id) appears twice") }
            var keys: [App.Key] = []
            for key in entry.keys {
                let hash = key.sha256.lowercased()
                guard hash.utf8.count == 64, hash.utf8.allSatisfy(\.isHexDigit) else {
                    throw AppsFileError("app \(entry.id): key sha256 must be 64 hex digits")
                }
                guard keysByHash[hash] == nil else { throw AppsFileError("app \(entry.id): a key is listed twice") }
                let parsed = App.Key(kind: key.kind, sha256: hash, user: key.user)
                keysByHash[hash] = (entry.id, parsed)
                keys.append(parsed)
            }
            for (name, value) in [("teamId", entry.apns.teamId), ("keyId", entry.apns.keyId)] {
                guard value.utf8.count == 10, value.allSatisfy({ $0.isASCII && ($0.isUppercase || $0.isNumber) }) else {
                    throw AppsFileError("app \(entry.id): apns.\(name) must be 10 upper-case letters or digits")
                }
            }
            guard !entry.apns.bundleId.isEmpty, !entry.apns.bundleId.hasSuffix(".") else {
                throw AppsFileError("app \(entry.id): apns.bundleId is required")
            }
            var privateKey: PrivateKey?
            if reader == .dispatcher {
                do { privateKey = try PrivateKey(pem: readFile(entry.apns.privateKeyPath)) } catch {
                    throw AppsFileError("app \(entry.id): apns.privateKeyPath: \(error)")
                }
                guard privateKey?.algorithm == .es256 else {
                    throw AppsFileError("app \(entry.id): the APNs key must be a P-256 (.p8) key")
                }
            }
            func secret(_ field: String, _ path: String) throws -> SharedSecret {
                let text = try readFile(path)
                do throws(ConfigurationError) { return try SharedSecret(bytes: Array(text.utf8)) } catch {
                    throw AppsFileError("app \(entry.id): \(field): \(error.message)")
                }
            }
            var jobSigningSecrets: [SharedSecret] = []
            if reader == .dispatcher {
                for (index, path) in (entry.jobSigningSecretPaths ?? []).enumerated() {
                    jobSigningSecrets.append(try secret("jobSigningSecretPaths[\(index)]", path))
                }
            }
            let prefixes = entry.privateChannelPrefixes ?? []
            guard prefixes.allSatisfy({ !$0.isEmpty }) else {
                throw AppsFileError("app \(entry.id): privateChannelPrefixes must not contain an empty prefix")
            }
            guard prefixes.isEmpty || entry.channelGrantSecretPath != nil else {
                throw AppsFileError("app \(entry.id): privateChannelPrefixes needs channelGrantSecretPath")
            }
            var grantSecret: SharedSecret?
            if reader == .ingest, let path = entry.channelGrantSecretPath {
                grantSecret = try secret("channelGrantSecretPath", path)
            }
            var oauth: App.OAuth?
            if let o = entry.oauth {
                guard !o.issuer.isEmpty, !o.audience.isEmpty else {
                    throw AppsFileError("app \(entry.id): oauth needs issuer and audience")
                }
                guard appsByIssuer[o.issuer] == nil else {
                    throw AppsFileError("app \(entry.id): oauth issuer \(o.issuer) is used by another app")
                }
                do { oauth = App.OAuth(issuer: o.issuer, audience: o.audience, publicKey: try PublicKey(pem: readFile(o.publicKeyPath))) } catch {
                    throw AppsFileError("app \(entry.id): oauth.publicKeyPath: \(error)")
                }
                appsByIssuer[o.issuer] = entry.id
            }
            apps[entry.id] = App(id: entry.id, keys: keys,
                                 apns: .init(teamId: entry.apns.teamId, keyId: entry.apns.keyId,
                                             bundleId: entry.apns.bundleId, privateKey: privateKey),
                                 oauth: oauth, jobSigningSecrets: jobSigningSecrets,
                                 privateChannelPrefixes: prefixes, channelGrantSecret: grantSecret)
        }
        return AppDirectory(apps: apps, keysByHash: keysByHash, appsByIssuer: appsByIssuer)
    }

    /// The app and key a presented API key belongs to, or nil. The key's SHA-256 is looked up, then compared in
    /// constant time. A key that authenticated is remembered in this directory's memory only (`RecentKeys`,
    /// bounded, never written anywhere), so a client's next requests skip the hashing.
    public func authenticate(apiKey: String) -> Principal? {
        guard apiKey.hasPrefix(APIKeyKind.public.prefix) || apiKey.hasPrefix(APIKeyKind.secret.prefix) else { return nil }
        let presented = Array(apiKey.utf8)
        if let principal = recentKeys.principal(for: presented) { return principal }
        let digest = SHA256.hash(presented)
        let hex = Hex.encode(digest)
        guard let (appID, key) = keysByHash[hex], let stored = Hex.decode(key.sha256),
              ConstantTime.equals(stored, digest) else { return nil }
        let principal = Principal(appID: appID, kind: key.kind, user: key.user ?? "default", rateLimitKey: "key:" + hex,
                                  isSharedByDevices: key.kind == .public)
        recentKeys.remember(presented, as: principal)
        return principal
    }

    /// The app whose OAuth issuer is `issuer`.
    public func app(forIssuer issuer: String) -> App? { appsByIssuer[issuer].flatMap { apps[$0] } }

    private static func describe(_ error: any Error) -> String {
        switch error {
        case DecodingError.keyNotFound(let key, let context):
            "missing \((context.codingPath + [key]).map(\.stringValue).joined(separator: "."))"
        case DecodingError.typeMismatch(_, let context), DecodingError.valueNotFound(_, let context):
            "\(context.codingPath.map(\.stringValue).joined(separator: ".")): \(context.debugDescription)"
        case DecodingError.dataCorrupted(let context): context.debugDescription
        default: "\(error)"
        }
    }
}

/// The last few API keys an `AppDirectory` authenticated, so a client's every request does not hash its key again
/// (SHA-256 and its hex were a few percent of herald-ingest's CPU per event).
///
/// Only keys that authenticated are kept, at most `capacity` (all are dropped when full), and only as long as the
/// directory that checked them: a reload builds a new directory with an empty cache, so a key removed from the apps
/// file is refused at once. Entries are found by a per-process seeded hash of the key and then compared in constant
/// time, so lookups leak nothing about a stored key through timing, as the hash lookup they stand in for.
final class RecentKeys: Sendable {
    static let capacity = 256

    private let entries = Lock<[Int: (key: [UInt8], principal: Principal)]>([:])

    func principal(for key: [UInt8]) -> Principal? {
        let slot = Self.slot(key)
        guard let entry = entries.withLock({ $0[slot] }), ConstantTime.equals(entry.key, key) else { return nil }
        return entry.principal
    }

    func remember(_ key: [UInt8], as principal: Principal) {
        let slot = Self.slot(key)
        entries.withLock { entries in
            if entries.count >= Self.capacity { entries.removeAll() }
            entries[slot] = (key, principal)
        }
    }

    private static func slot(_ key: [UInt8]) -> Int {
        var hasher = Hasher()
        key.withUnsafeBytes { hasher.combine(bytes: $0) }
        return hasher.finalize()
    }
}

public struct AppsFileError: Error, CustomStringConvertible {
    public var message: String
    init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// A new API key and the apps-file entry that accepts it (`heraldctl keys new`).
public struct NewAPIKey: Sendable {
    public var key: String
    public var sha256: String

    public static func generate(kind: APIKeyKind) -> NewAPIKey {
        let key = kind.prefix + Base64URL.encode(SecureRandom.bytes(24))
        return NewAPIKey(key: key, sha256: SHA256.hex(key))
    }
}

/// The apps file as written on disk.
struct AppsFile: Decodable {
    struct Entry: Decodable {
        struct Key: Decodable { var kind: APIKeyKind; var sha256: String; var user: String? }
        struct APNs: Decodable { var teamId: String; var keyId: String; var privateKeyPath: String; var bundleId: String }
        struct OAuth: Decodable { var issuer: String; var audience: String; var publicKeyPath: String }
        var id: String
        var keys: [Key]
        var apns: APNs
        var oauth: OAuth?
        var jobSigningSecretPaths: [String]?
        var privateChannelPrefixes: [String]?
        var channelGrantSecretPath: String?
    }
    var apps: [Entry]
}
