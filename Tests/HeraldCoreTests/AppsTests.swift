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
        let registry = try AppRegistry(loading: path)
        #expect(registry.directory.authenticate(apiKey: removed.key)?.appID == "shop")
        #expect(registry.directory.authenticate(apiKey: removed.key)?.appID == "shop")
        try write([kept])
        try registry.reload(path: path)
        #expect(registry.directory.authenticate(apiKey: removed.key) == nil)
        #expect(registry.directory.authenticate(apiKey: kept.key)?.appID == "shop")
    }
}
