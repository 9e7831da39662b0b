import Foundation
import HeraldCrypto
import HeraldRedis
import HeraldRuntime
import HeraldTestSupport
import Testing

/// `rediss://` against a redis-server that speaks only TLS, asks for client certificates and knows Herald only as
/// an ACL user limited to `herald:*`: the pool and the event-loop connections alike.
@Suite(.serialized) struct RedisTLSTests {
    /// The server's URL with `ca` trusted and `identity` (certificate, key) presented; the good ones by default.
    static func configuration(_ server: TLSRedisServer, ca: String? = nil, identity: (String, String)?,
                              url: String? = nil) throws -> RedisConfiguration {
        let tls = try RedisTLS(caFile: ca ?? server.pki.ca, identity: identity.map { (certificateChain: $0.0, privateKey: $0.1) })
        return try RedisConfiguration(url: url ?? server.url, tls: tls, connectTimeout: .seconds(2), poolSize: 1)
    }

    static func goodIdentity(_ server: TLSRedisServer) -> (String, String) {
        (server.pki.clientCertificate, server.pki.clientKey)
    }

    static func failure(_ client: RedisClient, on harness: LoopHarness? = nil) async throws -> RedisError? {
        let attempt: @Sendable () async throws -> RedisError? = {
            do {
                _ = try await client.command(["PING"])
                return nil
            } catch let error as RedisError {
                return error
            }
        }
        guard let harness else { return try await attempt() }
        return try await harness.onLoop { try await attempt() }
    }

    @Test func poolAndLoopConnectionsWorkThroughTLSWithTheLimitedUser() async throws {
        let server = try TLSRedisServer(pki: try TestPKI(directory: try scratchDirectory("herald-redis-tls-") + "/pki"),
                                        directory: try scratchDirectory("herald-redis-tls-"), clientCertificates: true)
        try await server.waitUntilReady()
        let client = RedisClient(configuration: try Self.configuration(server, identity: Self.goodIdentity(server)))
        let key = "herald:test:tls:\(SecureRandom.hex(4))"

        #expect(try await client.command(["SET", key, "pooled"]) == .status("OK"))
        // A pipeline larger than one TLS record (16 KiB) both ways.
        let large = String(repeating: "x", count: 100_000)
        let replies = try await client.pipeline([["SET", key + ":large", large], ["GET", key + ":large"]])
        #expect(replies.last == .bulk(Array(large.utf8)))
        let harness = try LoopHarness()
        #expect(try await harness.onLoop { try await client.command(["GET", key]) } == .bulk(Array("pooled".utf8)))
        let onLoop = try await harness.onLoop { try await client.pipeline([["SET", key + ":large", large], ["GET", key + ":large"]]) }
        #expect(onLoop.last == .bulk(Array(large.utf8)))
        #expect(client.loopConnectionCount == 1)

        // The ACL holds: no key outside herald:*, no command outside the list.
        for forbidden in [["SET", "other:key", "x"], ["FLUSHALL"], ["KEYS", "*"], ["CONFIG", "GET", "*"]] {
            let error = await #expect(throws: RedisError.self, "\(forbidden[0]) was allowed") {
                try await client.command(forbidden)
            }
            #expect(error?.message.contains("NOPERM") == true)
        }
        await client.close()
        try await harness.stop()
        await server.stop()
    }

    @Test func anUntrustedServerAClientWithoutACertificateOrInClearAreRefused() async throws {
        let directory = try scratchDirectory("herald-redis-tls-")
        let server = try TLSRedisServer(pki: try TestPKI(directory: directory + "/pki"), directory: directory,
                                        clientCertificates: true)
        try await server.waitUntilReady()
        let harness = try LoopHarness()
        let cases: [(String, RedisConfiguration, String)] = [
            ("a CA that did not sign the server's certificate", try Self.configuration(server, ca: server.pki.otherCA, identity: Self.goodIdentity(server)),
             "certificate verify failed"),
            // TLS 1.3 ends the client's side of the handshake first: the server's alert may arrive as a reset.
            ("no client certificate", try Self.configuration(server, identity: nil), "TLS"),
            ("a client certificate the server does not trust",
             try Self.configuration(server, identity: (server.pki.otherClientCertificate, server.pki.otherClientKey)),
             "TLS"),
        ]
        for (what, configuration, expected) in cases {
            for onLoop in [false, true] {
                let client = RedisClient(configuration: configuration)
                let error = try await Self.failure(client, on: onLoop ? harness : nil)
                #expect(error?.code == .connection, "\(what), \(onLoop ? "loop" : "pool"): \(String(describing: error))")
                #expect(error?.message.contains(expected) == true, "\(what): \(error?.message ?? "no error")")
                #expect(error?.message.contains(server.password) == false)
                await client.close()
            }
        }

        // redis:// against the TLS port: the server drops the connection, nothing is answered.
        let clear = RedisClient(configuration: try RedisConfiguration(
            url: "redis://herald:\(server.password)@127.0.0.1:\(server.port)/0", connectTimeout: .seconds(1),
            commandTimeout: .seconds(1), poolSize: 1))
        let error = try await Self.failure(clear)
        #expect(error != nil && error?.code != .authentication)
        await clear.close()
        try await harness.stop()
        await server.stop()
    }

    @Test func tlsSettingsAreCheckedAtStart() throws {
        let pki = try TestPKI(directory: try scratchDirectory("herald-redis-tls-") + "/pki")
        #expect(throws: RedisURLError(.tlsSettingsWithoutTLS)) {
            try RedisConfiguration(url: "redis://127.0.0.1:6379/0", tls: try RedisTLS(caFile: pki.ca))
        }
        let fromEnvironment = try RedisConfiguration(environment: EnvironmentReader([
            "HERALD_REDIS_URL": "rediss://herald:pw@cache.internal:6380/0", "HERALD_REDIS_CA_FILE": pki.ca,
        ]))
        #expect(fromEnvironment.tls?.caFile == pki.ca && fromEnvironment.description == "rediss://herald:***@cache.internal:6380/0")
        let missing = #expect(throws: ConfigurationError.self) {
            try RedisConfiguration(environment: EnvironmentReader([
                "HERALD_REDIS_URL": "rediss://cache:6380", "HERALD_REDIS_CA_FILE": "/nonexistent/ca.pem",
            ]))
        }
        #expect(missing?.variable == "HERALD_REDIS_CA_FILE")
        let halfIdentity = #expect(throws: ConfigurationError.self) {
            try RedisConfiguration(environment: EnvironmentReader([
                "HERALD_REDIS_URL": "rediss://cache:6380", "HERALD_REDIS_CERT_FILE": pki.clientCertificate,
            ]))
        }
        #expect(halfIdentity?.variable == "HERALD_REDIS_CERT_FILE")
        // The password file replaces the URL's password and never shows in the description.
        let passwordFile = pki.directory + "/redis-password"
        try "from-a-secret\n".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let withFile = try RedisConfiguration(environment: EnvironmentReader([
            "HERALD_REDIS_URL": "rediss://herald@cache:6380/0", "HERALD_REDIS_PASSWORD_FILE": passwordFile,
        ]))
        #expect(withFile.username == "herald" && withFile.password == "from-a-secret")
        #expect(!withFile.description.contains("from-a-secret"))
        let noPassword = #expect(throws: ConfigurationError.self) {
            try RedisConfiguration(environment: EnvironmentReader(["HERALD_REDIS_URL": "rediss://herald@cache:6380/0"]))
        }
        #expect(noPassword?.message.contains("HERALD_REDIS_PASSWORD_FILE") == true)
    }
}
