import Testing
@testable import HeraldRedis

@Suite struct RedisConfigurationTests {
    @Test func defaultURLParses() throws {
        let configuration = try RedisConfiguration(url: RedisConfiguration.defaultURL)
        #expect(configuration.host == "127.0.0.1")
        #expect(configuration.port == 6379)
        #expect(configuration.database == 0)
        #expect(configuration.username == nil)
        #expect(configuration.password == nil)
        #expect(configuration.connectTimeout == .seconds(2))
        #expect(configuration.commandTimeout == .seconds(2))
        #expect(configuration.poolSize == 4)
    }

    @Test func passwordOnlyUserAndPasswordAndDatabase() throws {
        let passwordOnly = try RedisConfiguration(url: "redis://:s3cret@redis.internal:6380/2")
        #expect(passwordOnly.host == "redis.internal")
        #expect(passwordOnly.port == 6380)
        #expect(passwordOnly.username == nil)
        #expect(passwordOnly.password == "s3cret")
        #expect(passwordOnly.database == 2)

        let withUser = try RedisConfiguration(url: "redis://herald:p%40ss%3Aword@10.0.0.5/15", poolSize: 8)
        #expect(withUser.username == "herald")
        #expect(withUser.password == "p@ss:word")
        #expect(withUser.port == 6379)
        #expect(withUser.database == 15)
        #expect(withUser.poolSize == 8)
    }

    @Test func hostOnlyIPv6AndTrailingSlash() throws {
        let bare = try RedisConfiguration(url: "redis://cache")
        #expect(bare.host == "cache")
        #expect(bare.port == 6379)
        #expect(bare.database == 0)

        let ipv6 = try RedisConfiguration(url: "REDIS://[::1]:7000/")
        #expect(ipv6.host == "::1")
        #expect(ipv6.port == 7000)
        #expect(ipv6.description == "redis://[::1]:7000/0")
    }

    @Test func severalHostsAreClusterSeeds() throws {
        let configuration = try RedisConfiguration(url: "rediss://herald:pw@node-a:7000,node-b,[::1]:7002/0")
        #expect(configuration.seeds == [RedisAddress(host: "node-a", port: 7000), RedisAddress(host: "node-b", port: 6379),
                                        RedisAddress(host: "::1", port: 7002)])
        #expect((configuration.host, configuration.port) == ("node-a", 7000))
        #expect(configuration.username == "herald" && configuration.password == "pw")
        #expect(configuration.description == "rediss://herald:***@node-a:7000,node-b:6379,[::1]:7002/0")
        #expect(try RedisConfiguration(url: "redis://cache").seeds == [RedisAddress(host: "cache", port: 6379)])
    }

    @Test func descriptionNeverShowsThePassword() throws {
        let configuration = try RedisConfiguration(url: "redis://herald:topsecret@cache:6379/1")
        #expect(configuration.description == "redis://herald:***@cache:6379/1")
        #expect(!configuration.description.contains("topsecret"))
    }

    /// Generated passwords often carry "/" (base64): one left unencoded is still the password, not the start of
    /// the database number, so it can never surface in an error about the port or the database.
    @Test func anUnencodedSlashInThePasswordStaysInThePassword() throws {
        let slashed = try RedisConfiguration(url: "redis://herald:abc/def@cache:6380/3")
        #expect(slashed.password == "abc/def" && slashed.username == "herald")
        #expect((slashed.host, slashed.port, slashed.database) == ("cache", 6380, 3))
        let numeric = try RedisConfiguration(url: "redis://u:1234/secret@cache/0")
        #expect(numeric.password == "1234/secret" && numeric.host == "cache")
        #expect(throws: RedisURLError.self) { try RedisConfiguration(url: "redis://u:s3kr1t/Zq9@cache:x/0") }
        do { _ = try RedisConfiguration(url: "redis://u:s3kr1t/Zq9@cache:x/0") } catch {
            #expect(!"\(error)".contains("s3kr1t") && !"\(error)".contains("Zq9"), "\(error)")
        }
    }

    @Test(arguments: [
        ("http://localhost:6379", RedisURLError.Problem.unsupportedScheme("http")),
        ("localhost:6379", .malformed("expected redis://host:port/db")),
        ("redis://", .missingHost),
        ("redis://:pw@:6379/0", .missingHost),
        ("redis://localhost:0", .invalidPort("0")),
        ("redis://localhost:65536", .invalidPort("65536")),
        ("redis://localhost:port", .invalidPort("port")),
        ("redis://localhost:", .invalidPort("")),
        ("redis://localhost/abc", .invalidDatabase("abc")),
        ("redis://localhost/-1", .invalidDatabase("-1")),
        ("redis://localhost/1/2", .invalidDatabase("1/2")),
        ("redis://@localhost", .invalidCredentials),
        ("redis://:bad%zz@localhost", .invalidCredentials),
        ("redis://localhost?db=1", .malformed("query strings and fragments are not supported")),
        ("redis://[::1", .malformed("unclosed \"[\" in the host")),
        ("redis://a:7000,,b:7001", .missingHost),
        ("redis://a:7000,b:x", .invalidPort("x")),
    ])
    func badURLsNameTheProblem(url: String, problem: RedisURLError.Problem) {
        #expect(throws: RedisURLError(problem)) { try RedisConfiguration(url: url) }
    }

    @Test func urlErrorTextNamesTheProblemWithoutThePassword() {
        let error = #expect(throws: RedisURLError.self) { try RedisConfiguration(url: "redis://:hunter2@host:99999") }
        #expect(error?.description == "Redis URL: port must be a number in 1...65535, got \"99999\"")
        #expect(error?.description.contains("hunter2") == false)
        #expect(RedisURLError(.unsupportedScheme("http")).description.contains("rediss://"))
    }
}

@Suite struct RedisEncodingTests {
    @Test func commandsAreEncodedAsRESPArraysOfBulkStrings() {
        var encoder = RESPEncoder()
        encoder.append(["SET", "k", "héllo"])
        encoder.append([[0, 13, 10], []])
        #expect(encoder.commandCount == 2)
        let expected = "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$6\r\nhéllo\r\n" + "*2\r\n$3\r\n\0\r\n\r\n$0\r\n\r\n"
        #expect(encoder.bytes == Array(expected.utf8))
    }

    @Test func longArgumentsGetMultiDigitLengths() {
        var encoder = RESPEncoder()
        encoder.append(Array(repeating: "x", count: 12) + [String(repeating: "y", count: 1_234)])
        let text = String(decoding: encoder.bytes, as: UTF8.self)
        #expect(text.hasPrefix("*13\r\n$1\r\nx\r\n"))
        #expect(text.contains("$1234\r\n"))
    }

    @Test func scriptSHA1MatchesKnownDigests() {
        #expect(SHA1.hexDigest([]) == "da39a3ee5e6b4b0d3255bfef95601890afd80709")
        #expect(SHA1.hexDigest(Array("abc".utf8)) == "a9993e364706816aba3e25717850c26c9cd0d89d")
        let twoBlocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
        #expect(SHA1.hexDigest(Array(twoBlocks.utf8)) == "84983e441c3bd26ebaae4aa1f95129e5e54670f1")
        #expect(RedisScript(source: "return 1").sha1 == "e0e1f9fabfc9d4800c877a703b823ac0578ff8db")
    }

    @Test func valueAccessors() {
        #expect(RedisValue.bulk(Array("42".utf8)).int == 42)
        #expect(RedisValue.integer(7).int == 7)
        #expect(RedisValue.status("OK").string == "OK")
        #expect(RedisValue.null.string == nil)
        #expect(RedisValue.null.isNull)
        let hash = RedisValue.array([.bulk(Array("a".utf8)), .bulk(Array("1".utf8)), .bulk(Array("b".utf8)), .bulk([])])
        #expect(hash.fieldValues == ["a": "1", "b": ""])
        #expect(hash.strings == ["a", "1", "b", ""])
        #expect(RedisValue.error("ERR x").errorMessage == "ERR x")
        #expect(RedisError(.server, "WRONGTYPE Operation").serverErrorPrefix == "WRONGTYPE")
        #expect(RedisError(.timeout, "slow").isConnectionFailure)
        #expect(!RedisError(.server, "ERR").isConnectionFailure)
        // A script's SHA-1, or a push token in a key, never reaches a log or a dead letter whole.
        let sha = "1878131de696bfd5c6ea50125e0caebf2dce59fe", token = String(repeating: "ab", count: 32)
        let scripted = RedisError.fromReply("WRONGTYPE Operation against a key script: \(sha), on @user_script:34.")
        #expect(scripted.message == "WRONGTYPE Operation against a key script: 187813…, on @user_script:34.")
        #expect(scripted.isAboutTheData && scripted.serverErrorPrefix == "WRONGTYPE")
        #expect(RedisError(.server, "ERR key herald:{a:d:\(token)}:dev").message == "ERR key herald:{a:d:ababab…}:dev")
        #expect(RedisError(.server, "ERR id \(token.prefix(31))").message == "ERR id \(token.prefix(31))")
    }

    @Test func redirectionsNameTheNodeOrLeaveItsHostToTheAskedOne() {
        let asked = RedisAddress(host: "10.0.0.7", port: 6379)
        #expect(RedisCluster.Redirect(.error("MOVED 3999 127.0.0.1:6381"), asked: asked)
                == .moved(slot: 3999, to: RedisAddress(host: "127.0.0.1", port: 6381)))
        #expect(RedisCluster.Redirect(.error("ASK 12 [::1]:7000"), asked: asked) == .ask(slot: 12, to: RedisAddress(host: "::1", port: 7000)))
        // cluster-preferred-endpoint-type unknown-endpoint, or a node without a hostname: the port only.
        #expect(RedisCluster.Redirect(.error("MOVED 3999 :6381"), asked: asked)
                == .moved(slot: 3999, to: RedisAddress(host: "10.0.0.7", port: 6381)))
        #expect(RedisCluster.Redirect(.error("ASK 3999 ?:6381"), asked: asked) == .ask(slot: 3999, to: RedisAddress(host: "10.0.0.7", port: 6381)))
        #expect(RedisCluster.Redirect(.error("TRYAGAIN Multiple keys request during rehashing of slot"), asked: asked) == .tryAgain)
        #expect(RedisCluster.Redirect(.error("TRYAGAINX"), asked: asked) == nil)
        #expect(RedisCluster.Redirect(.error("ERR MOVED"), asked: asked) == nil)
        #expect(RedisCluster.Redirect(.status("MOVED 1 a:1"), asked: asked) == nil)
    }

    /// `CLUSTER SLOTS` names a node by its endpoint, or by NULL or "" for one the asked node's host reaches; "?" is
    /// a node whose address is unknown, so its slots get none.
    @Test func slotMapsNameTheNodeOrLeaveItsHostToTheAskedOne() throws {
        let asked = RedisAddress(host: "10.0.0.7", port: 6379)
        func range(_ start: Int64, _ end: Int64, _ host: RedisValue, _ port: Int64) -> RedisValue {
            .array([.integer(start), .integer(end), .array([host, .integer(port), .bulk(Array("id".utf8))])])
        }
        let reply = RedisValue.array([range(0, 5460, .bulk(Array("redis-0.internal".utf8)), 6379),
                                      range(5461, 10922, .null, 6380), range(10923, 16383, .bulk(Array("?".utf8)), 6381)])
        let ranges = try #require(RedisCluster.slotRanges(reply, asked: asked))
        #expect(ranges.map(\.0) == [0...5460, 5461...10922])
        #expect(ranges.map(\.1) == [RedisAddress(host: "redis-0.internal", port: 6379), RedisAddress(host: "10.0.0.7", port: 6380)])
        let empty = RedisValue.array([range(0, 16383, .bulk([]), 6382)])
        #expect(RedisCluster.slotRanges(empty, asked: asked)?.map(\.1) == [RedisAddress(host: "10.0.0.7", port: 6382)])
        #expect(RedisCluster.slotRanges(.array([range(0, 1, .integer(1), 6379)]), asked: asked) == nil)
    }
}
