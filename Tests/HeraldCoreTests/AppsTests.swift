import Foundation
import HeraldCore
import HeraldCrypto
import HeraldRuntime
import Testing

/// An apps file with fresh keys in a temporary folder.
struct AppsFixture {
    let directory: AppDirectory
    let publicKey = NewAPIKey.generate(kind: .public)
    let secretKey = NewAPIKey.generate(kind: .secret)
    let otherAppKey = NewAPIKey.generate(kind: .secret)

    init() throws {
        let apnsKey = try PrivateKey.generateP256().pem
        let oauthKey = try PrivateKey.generateRSA().publicKey.pem
        let json = """
            {"apps": [
              {"id": "shop", "keys": [{"kind": "public", "sha256": "\(publicKey.sha256)", "user": "u1"},
                                      {"kind": "secret", "sha256": "\(secretKey.sha256.uppercased())"}],
               "apns": {"teamId": "TEAM123456", "keyId": "KEY1234567", "privateKeyPath": "keys/shop.p8",
                        "bundleId": "com.example.shop"},
               "oauth": {"issuer": "https://auth.example.com", "audience": "herald", "publicKeyPath": "oauth.pem"}},
              {"id": "news", "keys": [{"kind": "secret", "sha256": "\(otherAppKey.sha256)"}],
               "apns": {"teamId": "TEAM654321", "keyId": "KEY7654321", "privateKeyPath": "/abs/news.p8",
                        "bundleId": "com.example.news"}}
            ]}
            """
        directory = try AppDirectory.parse(Data(json.utf8)) { path in
            switch path {
            case "keys/shop.p8", "/abs/news.p8": apnsKey
            case "oauth.pem": oauthKey
            default: throw CocoaError(.fileNoSuchFile)
            }
        }
    }
}

@Suite struct AppsTests {
    @Test func authenticatesKeysByHashWithKindAndUser() throws {
        let fixture = try AppsFixture()
        let device = try #require(fixture.directory.authenticate(apiKey: fixture.publicKey.key))
        #expect(device.appID == "shop" && device.kind == .public && device.user == "u1")
        let producer = try #require(fixture.directory.authenticate(apiKey: fixture.secretKey.key))
        #expect(producer.kind == .secret && producer.user == "default")
        #expect(fixture.directory.authenticate(apiKey: fixture.otherAppKey.key)?.appID == "news")
        #expect(fixture.directory.authenticate(apiKey: "hrd_pub_unknown") == nil)
        #expect(fixture.directory.authenticate(apiKey: fixture.publicKey.sha256) == nil)
        #expect(fixture.directory.app(forIssuer: "https://auth.example.com")?.id == "shop")
    }

    /// An app owns its bundle id and `<bundleId>.<anything>`, nothing else (compared byte by byte).
    @Test func anAppOwnsItsBundleIdAndItsExtensionsOnly() throws {
        let shop = try #require(try AppsFixture().directory.apps["shop"])
        for owned in ["com.example.shop", "com.example.shop.widget", "com.example.shop.a.b", "com.example.shop."] {
            #expect(shop.owns(bundleID: owned), "\(owned)")
        }
        for other in ["com.example.shopping", "com.example.sho", "com.example", "", "com.example.news",
                      "xcom.example.shop", "com.example.shop-x", "COM.EXAMPLE.SHOP"] {
            #expect(!shop.owns(bundleID: other), "\(other)")
        }
    }

    @Test func newKeysHaveTheirKindPrefixAndMatchTheirHash() {
        let key = NewAPIKey.generate(kind: .secret)
        #expect(key.key.hasPrefix("hrd_sec_") && key.key.count > 30)
        #expect(key.sha256 == SHA256.hex(key.key))
        #expect(NewAPIKey.generate(kind: .public).key.hasPrefix("hrd_pub_"))
    }

    @Test(arguments: [
        (#"{"apps": [{"id": "a", "keys": [], "apns": {"teamId": "short", "keyId": "KEY1234567", "privateKeyPath": "k", "bundleId": "b"}}]}"#, "teamId"),
        (#"{"apps": [{"id": "a b", "keys": [], "apns": {"teamId": "TEAM123456", "keyId": "KEY1234567", "privateKeyPath": "k", "bundleId": "b"}}]}"#, "app id"),
        (#"{"apps": [{"id": "a", "keys": [{"kind": "public", "sha256": "xyz"}], "apns": {"teamId": "TEAM123456", "keyId": "KEY1234567", "privateKeyPath": "k", "bundleId": "b"}}]}"#, "64 hex"),
        (#"{"apps": [{"id": "a", "keys": [], "apns": {"teamId": "TEAM123456", "keyId": "KEY1234567", "bundleId": "b"}}]}"#, "privateKeyPath"),
        (#"{"apps": [{"id": "a", "keys": [], "apns": {"teamId": "TEAM123456", "keyId": "KEY1234567", "privateKeyPath": "missing", "bundleId": "b"}}]}"#, "privateKeyPath"),
        ("not json", "not a valid apps file"),
    ])
    func refusesBadAppsFiles(json: String, mentions: String) throws {
        let key = try PrivateKey.generateP256().pem
        #expect {
            _ = try AppDirectory.parse(Data(json.utf8)) { path in
                guard path == "k" else { throw CocoaError(.fileNoSuchFile) }
                return key
            }
        } throws: { error in
            "\(error)".contains(mentions)
        }
    }

    @Test func rememberedKeysAuthenticateAlikeAndNearMissesDoNot() throws {
        let fixture = try AppsFixture()
        let first = try #require(fixture.directory.authenticate(apiKey: fixture.secretKey.key))
        for _ in 0..<3 { #expect(fixture.directory.authenticate(apiKey: fixture.secretKey.key) == first) }
        #expect(first.rateLimitKey == "key:" + fixture.secretKey.sha256)
        var changed = Array(fixture.secretKey.key.utf8)
        changed[changed.count - 1] = changed[changed.count - 1] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        for nearMiss in [String(decoding: changed, as: UTF8.self), fixture.secretKey.key + "x",
                         String(fixture.secretKey.key.dropLast())] {
            #expect(fixture.directory.authenticate(apiKey: nearMiss) == nil)
        }
        #expect(fixture.directory.authenticate(apiKey: fixture.publicKey.key)?.kind == .public)
        #expect(fixture.directory.authenticate(apiKey: fixture.secretKey.key) == first)
    }

    @Test func aReloadForgetsRemovedKeysAtOnce() throws {
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("apps-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        try PrivateKey.generateP256().pem.write(to: folder.appendingPathComponent("shop.p8"), atomically: true, encoding: .utf8)
        let kept = NewAPIKey.generate(kind: .secret), removed = NewAPIKey.generate(kind: .secret)
        func write(_ keys: [NewAPIKey]) throws {
            let list = keys.map { #"{"kind": "secret", "sha256": "\#($0.sha256)"}"# }.joined(separator: ",")
            try #"{"apps": [{"id": "shop", "keys": [\#(list)], "apns": {"teamId": "TEAM123456", "keyId": "KEY1234567", "privateKeyPath": "shop.p8", "bundleId": "com.example.shop"}}]}"#
                .write(to: folder.appendingPathComponent("apps.json"), atomically: true, encoding: .utf8)
        }
        let path = folder.appendingPathComponent("apps.json").path
        try write([kept, removed])
        let registry = try AppRegistry(loading: path, for: .dispatcher)
        #expect(registry.directory.authenticate(apiKey: removed.key)?.appID == "shop")
        #expect(registry.directory.authenticate(apiKey: removed.key)?.appID == "shop")
        try write([kept])
        try registry.reload(path: path)
        #expect(registry.directory.authenticate(apiKey: removed.key) == nil)
        #expect(registry.directory.authenticate(apiKey: kept.key)?.appID == "shop")
    }
}

@Suite struct SecretsAndSignaturesTests {
    static let apps = #"""
        {"apps": [{"id": "shop", "keys": [],
                   "apns": {"teamId": "TEAM123456", "keyId": "KEY1234567", "privateKeyPath": "shop.p8", "bundleId": "b"},
                   "jobSigningSecretPaths": ["jobs-new.secret", "jobs-old.secret"],
                   "privateChannelPrefixes": ["order:", "user:"], "channelGrantSecretPath": "grants.secret"}]}
        """#

    /// Each process reads only the key material it uses: ingest never opens a `.p8` or a job-signing secret.
    @Test func eachReaderOpensOnlyItsOwnKeyFiles() throws {
        let key = try PrivateKey.generateP256().pem
        var opened: [String] = []
        let read = { (path: String) throws -> String in
            opened.append(path)
            return path.hasSuffix(".p8") ? key : "  \(path)-0123456789abcdef\n"
        }
        let ingest = try #require(try AppDirectory.parse(Data(Self.apps.utf8), for: .ingest, readFile: read).apps["shop"])
        #expect(opened == ["grants.secret"])
        #expect(ingest.apns.privateKey == nil && ingest.jobSigningSecrets.isEmpty && ingest.channelGrantSecret != nil)
        #expect(ingest.isPrivate(channel: "order:42:status") && ingest.isPrivate(channel: "user:7")
                && !ingest.isPrivate(channel: "news:sport") && !ingest.isPrivate(channel: "orders"))
        opened = []
        let dispatcher = try #require(try AppDirectory.parse(Data(Self.apps.utf8), for: .dispatcher, readFile: read).apps["shop"])
        #expect(opened == ["shop.p8", "jobs-new.secret", "jobs-old.secret"])
        #expect(dispatcher.apns.privateKey != nil && dispatcher.jobSigningSecrets.count == 2
                && dispatcher.channelGrantSecret == nil)
    }

    /// Redis keys a channel by its bytes, so the private-prefix and grant checks compare bytes: `user:` followed
    /// by a combining accent is one character `:\u{301}` to String, and `é` is `e` + U+0301 to `==`.
    @Test func privateChannelsAndGrantsCompareBytes() throws {
        let app = try #require(try AppDirectory.parse(Data(Self.apps.utf8), for: .ingest) { _ in "0123456789abcdef" }
            .apps["shop"])
        #expect(app.isPrivate(channel: "user:\u{301}alice"), "a combining mark after the prefix")
        let secret = try #require(app.channelGrantSecret)
        let now = 1_800_000_000.0
        func check(_ claims: [String: JSONValue], _ channel: String) -> Bool {
            var claims = claims
            (claims["app"], claims["exp"]) = (.string("shop"), .number(now + 60))
            let token = ChannelGrant.sign(claims: claims, secret: secret)
            return (try? ChannelGrant.check(token, channel: channel, app: app, now: now, skew: 0)) != nil
        }
        #expect(check(["channel": .string("user:Jos\u{e9}")], "user:Jos\u{e9}"))
        #expect(!check(["channel": .string("user:Jos\u{e9}")], "user:Jose\u{301}"), "another spelling, another channel")
        #expect(!check(["channels": .array([.string("user:Jos\u{e9}")])], "user:Jose\u{301}"))
        #expect(check(["channels": .array([.string("user:*")])], "user:\u{301}x"))
        #expect(!check(["channels": .array([.string("user:e*")])], "user:\u{e9}"), "a prefix of bytes, not of characters")
        #expect(!check(["channels": .array([.string("user:e\u{301}*")])], "user:\u{e9}x"))
    }

    @Test func secretsAreTrimmedAndMustBeLongEnough() throws {
        let padded = try SharedSecret(bytes: Array(" \t0123456789abcdef\r\n".utf8))
        let plain = try SharedSecret(bytes: Array("0123456789abcdef".utf8))
        let record = Array(#"{"id":"j1"}"#.utf8)
        #expect(JobSignature.value(for: record, secret: padded) == JobSignature.value(for: record, secret: plain))
        #expect(throws: ConfigurationError.self) { try SharedSecret(bytes: Array("  short-secret  \n".utf8)) }
        #expect(throws: (any Error).self) {
            _ = try AppDirectory.parse(Data(Self.apps.utf8), for: .dispatcher) { path in
                path.hasSuffix(".p8") ? try PrivateKey.generateP256().pem : "tiny"
            }
        }
        let noGrantSecret = Self.apps.replacingOccurrences(of: #", "channelGrantSecretPath": "grants.secret""#, with: "")
        #expect { _ = try AppDirectory.parse(Data(noGrantSecret.utf8), for: .ingest) { _ in "0123456789abcdef" } }
            throws: { "\($0)".contains("channelGrantSecretPath") }
    }

    /// RFC 4231 test case 2, so the HMAC is the standard one a producer's library computes.
    @Test func hmacMatchesRFC4231() {
        let mac = HMACSHA256.authenticate(Array("what do ya want for nothing?".utf8), key: Array("Jefe".utf8))
        #expect(Hex.encode(mac) == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
    }

    @Test func signaturesVerifyWithAnyListedSecretAndOnlyThen() throws {
        let new = try SharedSecret(bytes: Array("new-secret-0123456789".utf8))
        let old = try SharedSecret(bytes: Array("old-secret-0123456789".utf8))
        let other = try SharedSecret(bytes: Array("another-app-0123456789".utf8))
        let record = Array(#"{"appId":"shop","id":"j1"}"#.utf8)
        let signed = JobSignature.value(for: record, secret: old)
        #expect(String(decoding: signed, as: UTF8.self).hasPrefix("v1=") && signed.count == 67)
        let header = { (value: [UInt8]) in [(name: JobSignature.header, value: value)] }
        #expect(JobSignature.verifies(header(signed), record: record, secrets: [new, old]))
        #expect(!JobSignature.verifies(header(signed), record: record, secrets: [new, other]))
        #expect(!JobSignature.verifies(header(signed), record: record + [0x20], secrets: [old]))
        #expect(!JobSignature.verifies([], record: record, secrets: [old]))
        #expect(!JobSignature.verifies(header(signed) + header(signed), record: record, secrets: [old]), "two signatures")
        let upper = Array(String(decoding: signed, as: UTF8.self).uppercased().replacingOccurrences(of: "V1=", with: "v1=").utf8)
        #expect(!JobSignature.verifies(header(upper), record: record, secrets: [old]), "upper-case hex")
        #expect(!JobSignature.verifies(header(Array("v2=".utf8) + signed.dropFirst(3)), record: record, secrets: [old]))
    }

    @Test func signingIsRequiredUnlessExplicitlyOff() throws {
        #expect { try JobSigning(EnvironmentReader([:])) } throws: { "\($0)".contains("HERALD_JOB_SIGNING_SECRET_FILE") }
        guard case .unverified = try JobSigning(EnvironmentReader(["HERALD_JOB_SIGNATURES": "unverified"])) else {
            Issue.record("unverified was not taken"); return
        }
        #expect(throws: ConfigurationError.self) { try JobSigning(EnvironmentReader(["HERALD_JOB_SIGNATURES": "off"])) }
        #expect(throws: ConfigurationError.self) {
            try JobSigning(EnvironmentReader(["HERALD_JOB_SIGNING_SECRET_FILE": "/nonexistent/jobs.secret"]))
        }
    }
}
