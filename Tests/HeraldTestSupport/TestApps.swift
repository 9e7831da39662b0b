import Foundation
import HeraldCore
import HeraldCrypto
import HeraldRuntime

/// An apps file with fresh ids and keys in a temporary folder, for tests. App ids are random so tests sharing
/// one Redis never see each other's keys.
public struct TestApps: Sendable {
    public struct Entry: Sendable {
        public let id: String
        public let bundleID: String
        public let publicKey: String
        public let secretKey: String
        /// A public key with a user (`user-<id>`), for Live Activity registrations.
        public let userKey: String
        /// Each app is its own Apple developer team, so a simulator that binds bundle ids to teams refuses a push
        /// signed with another app's key.
        public let teamID: String
        public let keyID: String
        public let apnsKey: PrivateKey
        /// The OAuth issuer's signing key (ES256, or RS256 when the apps were made with `oauthAlgorithm: .rs256`)
        /// and issuer/audience; the apps file configures its public key.
        public let oauthKey: PrivateKey
        public let issuer: String
        public let audience = "herald"
        /// The app's own job-signing secret (`jobSigningSecretPaths`), for a direct producer's records.
        public let jobSecret: SharedSecret
        public let jobSecretPath: String
        /// The HS256 key of the app's channel grants (`channelGrantSecretPath`), as its file holds it.
        public let grantSecret: String
        /// Channels under this prefix are private (`privateChannelPrefixes`).
        public let privateChannelPrefix = "private:"
    }

    public let folder: URL
    public let path: String
    public let apps: [Entry]
    public let directory: AppDirectory
    /// The deployment's job-signing secret file (`HERALD_JOB_SIGNING_SECRET_FILE`) and its secret.
    public let jobSigningSecretPath: String
    public let deploymentSecret: SharedSecret
    public var jobSigning: JobSigning { .signed(deploymentSecret) }
    /// The apps file as herald-ingest loads it: channel-grant secrets, no APNs or job-signing keys.
    public let ingestDirectory: AppDirectory

    /// `count` apps; `oauthAlgorithm` picks the kind of every app's OAuth issuer key; `bundleID`, when given, is
    /// every app's (apps of one iOS app).
    public init(count: Int = 2, oauthAlgorithm: SignatureAlgorithm = .es256, bundleID: String? = nil) throws {
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("herald-apps-\(SecureRandom.hex(6))")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        var entries: [Entry] = []
        var json: [String] = []
        for index in 0..<count {
            let id = "app\(index)-\(SecureRandom.hex(4))"
            let keyID = String(("K" + SecureRandom.hex(8).uppercased()).prefix(10))
            let oauthKey = oauthAlgorithm == .es256 ? try PrivateKey.generateP256() : try PrivateKey.generateRSA()
            let jobSecret = SharedSecret.generateText(), grantSecret = SharedSecret.generateText()
            try "\(jobSecret)\n".write(to: folder.appendingPathComponent("\(id)-jobs.secret"), atomically: true, encoding: .utf8)
            try grantSecret.write(to: folder.appendingPathComponent("\(id)-grants.secret"), atomically: true, encoding: .utf8)
            let entry = Entry(id: id, bundleID: bundleID ?? "com.example.\(id.replacingOccurrences(of: "-", with: ""))",
                              publicKey: NewAPIKey.generate(kind: .public).key,
                              secretKey: NewAPIKey.generate(kind: .secret).key,
                              userKey: NewAPIKey.generate(kind: .public).key,
                              teamID: String(("T" + SecureRandom.hex(8).uppercased()).prefix(10)), keyID: keyID, apnsKey: try PrivateKey.generateP256(),
                              oauthKey: oauthKey, issuer: "https://auth-\(id).example.com",
                              jobSecret: try SharedSecret(bytes: Array(jobSecret.utf8)),
                              jobSecretPath: folder.appendingPathComponent("\(id)-jobs.secret").path, grantSecret: grantSecret)
            try entry.apnsKey.pem.write(to: folder.appendingPathComponent("\(id).p8"), atomically: true, encoding: .utf8)
            try entry.oauthKey.publicKey.pem.write(to: folder.appendingPathComponent("\(id)-oauth.pem"), atomically: true,
                                                  encoding: .utf8)
            json.append("""
                {"id": "\(id)", "keys": [{"kind": "public", "sha256": "\(SHA256.hex(entry.publicKey))"},
                                        {"kind": "secret", "sha256": "\(SHA256.hex(entry.secretKey))"},
                                        {"kind": "public", "sha256": "\(SHA256.hex(entry.userKey))", "user": "user-\(id)"}],
                 "apns": {"teamId": "\(entry.teamID)", "keyId": "\(keyID)", "privateKeyPath": "\(id).p8",
                          "bundleId": "\(entry.bundleID)"},
                 "oauth": {"issuer": "\(entry.issuer)", "audience": "\(entry.audience)", "publicKeyPath": "\(id)-oauth.pem"},
                 "jobSigningSecretPaths": ["\(id)-jobs.secret"],
                 "privateChannelPrefixes": ["\(entry.privateChannelPrefix)"], "channelGrantSecretPath": "\(id)-grants.secret"}
                """)
            entries.append(entry)
        }
        let file = folder.appendingPathComponent("apps.json")
        try Data("{\"apps\": [\(json.joined(separator: ",\n"))]}".utf8).write(to: file)
        path = file.path
        apps = entries
        directory = try AppDirectory.load(path: path)
        let secret = SharedSecret.generateText()
        jobSigningSecretPath = folder.appendingPathComponent("deployment-jobs.secret").path
        try secret.write(toFile: jobSigningSecretPath, atomically: true, encoding: .utf8)
        deploymentSecret = try SharedSecret(bytes: Array(secret.utf8))
        ingestDirectory = try AppDirectory.load(path: path, for: .ingest)
    }

    /// What a Herald process needs to read this apps file and sign or check jobs with the deployment's secret.
    public var environment: [String: String] {
        ["HERALD_APPS_FILE": path, "HERALD_JOB_SIGNING_SECRET_FILE": jobSigningSecretPath]
    }

    /// The signature header of a job record written with the deployment's secret, as Herald's own writers sign.
    public func signatureHeaders(_ record: [UInt8]) -> [(String, [UInt8])] { jobSigning.headers(for: record) }

    /// An OAuth access token for `app`, signed by its issuer; override any claim (nil removes it).
    public func accessToken(for app: Entry, subject: String = "alice", scope: String? = "activities:write",
                            lifetime: TimeInterval = 300, claims overrides: [String: JSONValue?] = [:],
                            key: PrivateKey? = nil) throws -> String {
        let now = Date().timeIntervalSince1970
        var claims: [String: JSONValue] = [
            "iss": .string(app.issuer), "aud": .string(app.audience), "sub": .string(subject),
            "iat": .number(now.rounded(.down)), "exp": .number((now + lifetime).rounded(.down)),
        ]
        if let scope { claims["scope"] = .string(scope) }
        for (name, value) in overrides { claims[name] = value }
        return try JSONWebToken.sign(claims: claims, keyID: nil, key: key ?? app.oauthKey)
    }

    public func remove() { try? FileManager.default.removeItem(at: folder) }
}
