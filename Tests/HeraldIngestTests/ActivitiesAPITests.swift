import Foundation
import HeraldCore
import HeraldCrypto
import HeraldRedis
import HeraldRuntime
import HeraldStore
import HeraldTestSupport
import Testing

/// `POST /api/v1/activities/register` and `POST /v1/apps/{appID}/activities/register` against the real Redis:
/// the response, what Redis holds (ids, TTLs, the post's index), expiry, validation, API keys and OAuth 2 bearer
/// tokens, the rate limit, and that the push token never leaves the server (responses or logs).
@Suite struct ActivitiesAPITests {
    static let path = "/api/v1/activities/register"

    // MARK: Registration and renewal

    @Test func registersWithTheDocumentedShapeAndNoPushToken() async throws {
        try await withIngest { ingest in
            let app = ingest.apps.apps[0]
            let token = SecureRandom.hex(32).uppercased(), post = postHash()
            let response = try await ingest.request("POST", Self.path, key: app.userKey,
                                                    json: registration(token, post, bundle: app.bundleID + ".widget"))
            #expect(response.status == 201, "\(response.text)")
            #expect(response.headers["ratelimit-limit"] == "240")
            #expect(!response.text.lowercased().contains(token.lowercased()))
            #expect(!response.text.contains("push_token"))
            let data = try #require(try response.json()["data"] as? [String: String], "\(response.text)")
            #expect(Set(data.keys) == ["id", "post_id_hash", "apns_environment", "bundle_id", "created_at", "last_seen_at"])
            let id = try #require(data["id"])
            #expect(id.utf8.count == 24 && id.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) })
            #expect(data["post_id_hash"] == post)
            #expect(data["apns_environment"] == "production")
            #expect(data["bundle_id"] == app.bundleID + ".widget")
            #expect(data["created_at"] == data["last_seen_at"])
            #expect(data["created_at"].flatMap(Timestamp.parse) != nil)
            try validateAgainstOpenAPI([response.body], pointer: Self.responseSchema(201))

            // Stored under the key's user with the normalised (lowercase) token, a TTL of an hour, and indexed.
            let keys = RedisKeys(app: app.id)
            let stored = try #require(try await ingest.redis.command(["HGETALL", keys.registration(id, post: post)]).fieldValues)
            #expect(stored["user"] == "user-\(app.id)")
            #expect(stored["pushToken"] == token.lowercased())
            let ttl = try #require(try await ingest.redis.command(["PTTL", keys.registration(id, post: post)]).int)
            #expect((3_590_000...3_600_000).contains(ttl))
            #expect(try await ingest.redis.command(["ZSCORE", keys.post(post), id]).string != nil)

            // The app-scoped route, a key without a user (→ `default`), and the sandbox environment.
            let scoped = try await ingest.request("POST", "/v1/apps/\(app.id)/activities/register", key: app.publicKey,
                                                  json: registration(token, post, environment: "sandbox", bundle: app.bundleID))
            #expect(scoped.status == 201, "\(scoped.text)")
            let scopedData = try #require(try scoped.json()["data"] as? [String: String])
            #expect(scopedData["apns_environment"] == "sandbox")
            #expect(scopedData["id"] != id)
            let other = try await ingest.redis.command(["HGET", keys.registration(scopedData["id"] ?? "", post: post), "user"])
            #expect(other.string == "default")
        }
    }

    @Test func repostKeepsIdAndCreatedAtMovesLastSeenAndRenewsTheTTL() async throws {
        try await withIngest { ingest in
            let app = ingest.apps.apps[0]
            let token = SecureRandom.hex(32), post = postHash()
            let keys = RedisKeys(app: app.id)
            let before = try await registrationMetrics(ingest)
            let first = try await ingest.request("POST", Self.path, key: app.userKey, json: registration(token, post, bundle: app.bundleID))
            #expect(first.status == 201, "\(first.text)")
            let created = try #require(try first.json()["data"] as? [String: String])
            let id = try #require(created["id"])

            try await Task.sleep(for: .milliseconds(1_200))
            let aged = try #require(try await ingest.redis.command(["PTTL", keys.registration(id, post: post)]).int)
            #expect(aged < 3_599_000)
            let agedScore = try #require(try await ingest.redis.command(["ZSCORE", keys.post(post), id]).string.flatMap(Double.init))

            let second = try await ingest.request("POST", Self.path, key: app.userKey,
                                                  json: registration(token, post, environment: "sandbox", bundle: app.bundleID))
            #expect(second.status == 201, "\(second.text)")
            let renewed = try #require(try second.json()["data"] as? [String: String])
            #expect(renewed["id"] == id)
            #expect(renewed["created_at"] == created["created_at"])
            #expect(renewed["apns_environment"] == "sandbox")
            let firstSeen = try #require(created["last_seen_at"].flatMap(Timestamp.parse))
            let lastSeen = try #require(renewed["last_seen_at"].flatMap(Timestamp.parse))
            #expect(lastSeen.timeIntervalSince(firstSeen) >= 1.1)

            let fresh = try #require(try await ingest.redis.command(["PTTL", keys.registration(id, post: post)]).int)
            #expect(fresh > aged + 1_000, "the TTL was not renewed: \(aged) ms → \(fresh) ms")
            let freshScore = try #require(try await ingest.redis.command(["ZSCORE", keys.post(post), id]).string.flatMap(Double.init))
            #expect(freshScore >= agedScore + 1_100)
            #expect(try await ingest.redis.command(["ZCARD", keys.post(post)]).int == 1)

            let after = try await registrationMetrics(ingest)
            #expect(after.new > before.new)
            #expect(after.renewed > before.renewed)
        }
    }

    @Test func registrationsExpireFromThePostIndexOnTheirOwn() async throws {
        try await withIngest(activityTTL: .seconds(4)) { ingest in
            let app = ingest.apps.apps[0]
            let keys = RedisKeys(app: app.id)
            let store = ActivityStore(redis: ingest.redis, ttl: .seconds(4))
            let post = postHash()
            let (stale, kept, late) = (SecureRandom.hex(32), SecureRandom.hex(32), SecureRandom.hex(32))
            func register(_ token: String) async throws -> String {
                let response = try await ingest.request("POST", Self.path, key: app.userKey,
                                                        json: registration(token, post, bundle: app.bundleID))
                #expect(response.status == 201, "\(response.text)")
                return try #require((try response.json()["data"] as? [String: String])?["id"])
            }
            let staleID = try await register(stale)
            let keptID = try await register(kept)
            #expect(try await store.postBatch(app: app.id, postIDHash: post, cursor: "0").registrations.count == 2)

            try await Task.sleep(for: .milliseconds(2_000))
            _ = try await register(kept)  // renewed: lives until ~6 s
            try await Task.sleep(for: .milliseconds(2_500))

            // ~4.5 s: the stale registration is gone. A new registration prunes it from the index before any reader
            // comes (it renews the index's TTL, which has fallen below the 4 s `ttl`, and prunes then), and the
            // dispatcher's read does not see it.
            #expect(try await ingest.redis.command(["EXISTS", keys.registration(staleID, post: post)]).int == 0)
            let lateID = try await register(late)
            #expect(try await ingest.redis.command(["ZSCORE", keys.post(post), staleID]).string == nil)
            let batch = try await store.postBatch(app: app.id, postIDHash: post, cursor: "0")
            #expect(Set(batch.registrations.map(\.id)) == [keptID, lateID])

            // ~9 s: every registration has expired, and with no reader or writer the index has gone with them.
            try await Task.sleep(for: .milliseconds(4_500))
            for key in [keys.post(post), keys.registration(keptID, post: post), keys.registration(lateID, post: post),
                        keys.activityToken(kept), keys.activityToken(late), keys.activityToken(stale)] {
                #expect(try await ingest.redis.command(["EXISTS", key]).int == 0, "\(key) outlived its registrations")
            }
            #expect(try await store.postBatch(app: app.id, postIDHash: post, cursor: "0").registrations.isEmpty)
        }
    }

    @Test func twoUsersRegisteringOneTokenForAPostAreTwoRegistrations() async throws {
        try await withIngest { ingest in
            let app = ingest.apps.apps[0]
            let token = SecureRandom.hex(32), post = postHash()
            let body = registration(token, post, bundle: app.bundleID)
            let alice = try ingest.apps.accessToken(for: app, subject: "alice")
            let bob = try ingest.apps.accessToken(for: app, subject: "bob")
            var ids: [String] = []
            let callers: [(String?, String?)] = [(app.userKey, nil), (app.publicKey, nil), (nil, alice), (nil, bob), (nil, alice)]
            for (key, bearer) in callers {
                let response = try await ingest.request("POST", Self.path, key: key, bearer: bearer, json: body)
                #expect(response.status == 201, "\(response.text)")
                ids.append(try #require((try response.json()["data"] as? [String: String])?["id"]))
            }
            #expect(Set(ids).count == 4)
            #expect(ids[4] == ids[2], "alice's re-post is a renewal")
            let batch = try await ActivityStore(redis: ingest.redis).postBatch(app: app.id, postIDHash: post, cursor: "0")
            #expect(Set(batch.registrations.map(\.user)) == ["user-\(app.id)", "default", "alice", "bob"])
            #expect(batch.registrations.allSatisfy { $0.pushToken == token })
        }
    }

    // MARK: Validation

    @Test func everyInvalidBodyIs400AndStoresNothing() async throws {
        try await withIngest { ingest in
            let app = ingest.apps.apps[0], otherApp = ingest.apps.apps[1]
            let token = SecureRandom.hex(32), post = postHash(), bundle = app.bundleID
            let cases: [(body: String, code: String, field: String?)] = [
                ("", "invalid_json", nil),
                ("{\"push_token\": ", "invalid_json", nil),
                ("[\"\(token)\"]", "invalid_body", nil),
                // Found by scripts/fuzz: a member named twice was read first-wins here and last-wins elsewhere.
                (#"{"push_token": "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1", "push_token": "a1.gxa'ple.app.widget"}"#,
                 "invalid_json", nil),
                (#"{"push_token": "\#(token)", "post_id_hash": "\#(post)", "bundle_id": "\#(bundle)", "push_token": "zz"}"#,
                 "invalid_json", nil),
                (#"{"post_id_hash": "\#(post)", "bundle_id": "\#(bundle)"}"#, "missing_field", "push_token"),
                (#"{"push_token": "", "post_id_hash": "\#(post)", "bundle_id": "\#(bundle)"}"#, "missing_field", "push_token"),
                (#"{"push_token": null, "post_id_hash": "\#(post)", "bundle_id": "\#(bundle)"}"#, "missing_field", "push_token"),
                (registration(token + "zz", post, bundle: bundle), "invalid_field", "push_token"),
                (registration(token + "a", post, bundle: bundle), "invalid_field", "push_token"),
                (registration(String(token.prefix(14)), post, bundle: bundle), "invalid_field", "push_token"),
                (registration(token + token + token + token, post, bundle: bundle), "invalid_field", "push_token"),
                (#"{"push_token": 12345678, "post_id_hash": "\#(post)", "bundle_id": "\#(bundle)"}"#, "invalid_field", "push_token"),
                (#"{"push_token": "\#(token)", "bundle_id": "\#(bundle)"}"#, "missing_field", "post_id_hash"),
                (registration(token, post.uppercased(), bundle: bundle), "invalid_field", "post_id_hash"),
                (registration(token, "abcdef0", bundle: bundle), "invalid_field", "post_id_hash"),
                (registration(token, String(repeating: "a", count: 65), bundle: bundle), "invalid_field", "post_id_hash"),
                (registration(token, "post-1234", bundle: bundle), "invalid_field", "post_id_hash"),
                (#"{"push_token": "\#(token)", "post_id_hash": 12345678, "bundle_id": "\#(bundle)"}"#, "invalid_field", "post_id_hash"),
                (registration(token, post, environment: "development", bundle: bundle), "invalid_field", "apns_environment"),
                (#"{"push_token": "\#(token)", "post_id_hash": "\#(post)", "apns_environment": 1, "bundle_id": "\#(bundle)"}"#,
                 "invalid_field", "apns_environment"),
                (#"{"push_token": "\#(token)", "post_id_hash": "\#(post)"}"#, "missing_field", "bundle_id"),
                (registration(token, post, bundle: otherApp.bundleID), "invalid_field", "bundle_id"),
                (registration(token, post, bundle: bundle + "evil"), "invalid_field", "bundle_id"),
                (registration(token, post, bundle: bundle + "."), "invalid_field", "bundle_id"),
                (registration(token, post, bundle: bundle + "..widget"), "invalid_field", "bundle_id"),
                (registration(token, post, bundle: bundle + ".wid get"), "invalid_field", "bundle_id"),
                (#"{"push_token": "\#(token)", "post_id_hash": "\#(post)", "bundle_id": "\#(bundle)", "user": "eve"}"#,
                 "unknown_field", "user"),
            ]
            var errorBodies: [[UInt8]] = []
            for (body, code, field) in cases {
                let response = try await ingest.request("POST", Self.path, key: app.userKey, json: body)
                #expect(response.status == 400, "\(body) → \(response.status) \(response.text)")
                #expect(response.errorCode == code, "\(body) → \(response.text)")
                #expect(response.errorField == field, "\(body) → \(response.text)")
                #expect(!response.text.contains(token), "\(body) → \(response.text) echoes the push token")
                errorBodies.append(response.body)
            }
            let wrongType = try await ingest.request("POST", Self.path, key: app.userKey,
                                                     json: registration(token, post, bundle: bundle),
                                                     headers: ["Content-Type": "text/plain"])
            #expect(wrongType.status == 415, "\(wrongType.text)")
            try validateAgainstOpenAPI(errorBodies, pointer: "#/components/schemas/Error")
            #expect(try await storedKeys(ingest, app: app.id).isEmpty)
        }
    }

    // MARK: Authentication and authorisation

    @Test func missingOrInvalidCredentialsAre401() async throws {
        try await withIngest { ingest in
            let app = ingest.apps.apps[0], other = ingest.apps.apps[1]
            let apps = ingest.apps
            let body = registration(SecureRandom.hex(32), postHash(), bundle: app.bundleID)
            let now = Date().timeIntervalSince1970
            let valid = try apps.accessToken(for: app)
            let parts = valid.split(separator: ".").map(String.init)
            let claims = parts[1]
            let header = { (json: String) in Base64URL.encode(Array(json.utf8)) }
            let hs256Input = header(#"{"alg":"HS256","typ":"JWT"}"#) + "." + claims
            let tokens: [(String, String)] = [
                ("signed with another P-256 key", try apps.accessToken(for: app, key: try PrivateKey.generateP256())),
                ("signed by another app's issuer key", try apps.accessToken(for: app, key: other.oauthKey)),
                ("RS256 for an ES256 app", try apps.accessToken(for: app, key: try PrivateKey.generateRSA())),
                ("expired", try apps.accessToken(for: app, claims: ["exp": .number((now - 600).rounded())])),
                ("not valid for ten minutes", try apps.accessToken(for: app, claims: ["nbf": .number((now + 600).rounded())])),
                ("without exp", try apps.accessToken(for: app, claims: ["exp": nil])),
                ("unknown issuer", try apps.accessToken(for: app, claims: ["iss": .string("https://evil.example.com")])),
                ("another app's issuer", try apps.accessToken(for: app, claims: ["iss": .string(other.issuer)])),
                ("wrong audience", try apps.accessToken(for: app, claims: ["aud": .string("someone-else")])),
                ("wrong audiences", try apps.accessToken(for: app, claims: ["aud": .array([.string("a"), .string("b")])])),
                ("without sub", try apps.accessToken(for: app, claims: ["sub": nil])),
                ("alg none", header(#"{"alg":"none","typ":"JWT"}"#) + "." + claims + "."),
                ("alg none, signature kept", header(#"{"alg":"none"}"#) + "." + claims + "." + parts[2]),
                ("HS256 keyed with the public key", hs256Input + "." + (try hmacSHA256(hs256Input, keyPEM: app.oauthKey.publicKey.pem))),
                ("claims swapped under a valid signature",
                 parts[0] + "." + (try apps.accessToken(for: app, subject: "mallory")).split(separator: ".")[1] + "." + parts[2]),
                ("not base64", "a.b.c"),
            ]
            for (why, token) in tokens {
                let response = try await ingest.request("POST", Self.path, bearer: token, json: body)
                #expect(response.status == 401, "\(why): \(response.status) \(response.text)")
                #expect(response.errorCode == "invalid_token", "\(why): \(response.text)")
                #expect(response.headers["www-authenticate"]?.hasPrefix("Bearer") == true, "\(why)")
                #expect(!response.text.contains(token), "\(why): the error echoes the token")
            }
            for (why, headers) in [("no credentials", [String: String]()),
                                   ("unknown key", ["X-API-Key": NewAPIKey.generate(kind: .public).key]),
                                   ("unknown bearer key", ["Authorization": "Bearer " + NewAPIKey.generate(kind: .secret).key]),
                                   ("basic auth", ["Authorization": "Basic dXNlcjpwYXNz"])] {
                let response = try await ingest.request("POST", Self.path, json: body, headers: headers)
                #expect(response.status == 401, "\(why): \(response.status) \(response.text)")
            }
            // The same token shapes are accepted when right: an audience list that includes Herald, and `scp`.
            let list = try apps.accessToken(for: app, scope: nil, claims: ["aud": .array([.string("x"), .string(app.audience)]),
                                                                           "scp": .array([.string("activities:write")])])
            let accepted = try await ingest.request("POST", Self.path, bearer: list, json: body)
            #expect(accepted.status == 201, "\(accepted.text)")
            #expect((try accepted.json()["data"] as? [String: String])?["id"] != nil)
            #expect(try await storedKeys(ingest, app: app.id).count == 3, "only the accepted request stored anything")
        }
    }

    @Test func tokensWithoutTheScopeAre403AndAppsStayApart() async throws {
        try await withIngest { ingest in
            let app = ingest.apps.apps[0], other = ingest.apps.apps[1]
            let body = registration(SecureRandom.hex(32), postHash(), bundle: app.bundleID)
            for scope in [nil, "activities:read profile", "activities:writer", "ACTIVITIES:WRITE"] as [String?] {
                let token = try ingest.apps.accessToken(for: app, scope: scope)
                let response = try await ingest.request("POST", Self.path, bearer: token, json: body)
                #expect(response.status == 403, "\(scope ?? "no scope"): \(response.text)")
                #expect(response.errorCode == "insufficient_scope")
                #expect(response.headers["www-authenticate"]?.contains("insufficient_scope") == true)
            }
            let token = try ingest.apps.accessToken(for: app)
            let foreignToken = try await ingest.request("POST", "/v1/apps/\(other.id)/activities/register", bearer: token, json: body)
            #expect(foreignToken.status == 403, "\(foreignToken.text)")
            let foreignKey = try await ingest.request("POST", "/v1/apps/\(other.id)/activities/register", key: app.userKey, json: body)
            #expect(foreignKey.status == 403, "\(foreignKey.text)")
            let unknown = try await ingest.request("POST", "/v1/apps/no-such-app/activities/register", bearer: token, json: body)
            #expect(unknown.status == 403, "\(unknown.text)")
            #expect(try await storedKeys(ingest, app: app.id).isEmpty)
            #expect(try await storedKeys(ingest, app: other.id).isEmpty)

            let own = try await ingest.request("POST", "/v1/apps/\(app.id)/activities/register", bearer: token, json: body)
            #expect(own.status == 201, "\(own.text)")
        }
    }

    @Test func acceptsRS256TokensWhenTheIssuerKeyIsRSA() async throws {
        try await withIngest(apps: try TestApps(count: 1, oauthAlgorithm: .rs256)) { ingest in
            let app = ingest.apps.apps[0]
            let post = postHash()
            let body = registration(SecureRandom.hex(32), post, bundle: app.bundleID)
            let good = try await ingest.request("POST", Self.path, bearer: try ingest.apps.accessToken(for: app, subject: "carol"),
                                                json: body)
            #expect(good.status == 201, "\(good.text)")
            let id = try #require((try good.json()["data"] as? [String: String])?["id"])
            #expect(try await ingest.redis.command(["HGET", RedisKeys(app: app.id).registration(id, post: post), "user"]).string == "carol")
            for key in [try PrivateKey.generateP256(), try PrivateKey.generateRSA()] {
                let bad = try await ingest.request("POST", Self.path, bearer: try ingest.apps.accessToken(for: app, key: key), json: body)
                #expect(bad.status == 401, "\(key.algorithm): \(bad.text)")
            }
        }
    }

    // MARK: Rate limit

    /// A user's public key counts per push token, an OAuth token per subject.
    @Test func overTheRateLimitIs429PerDeviceAndPerSubject() async throws {
        try await withIngest(rateLimit: 2) { ingest in
            // Counting across the end of a fixed minute window would start over: begin early in one.
            let second = Int(Date().timeIntervalSince1970) % 60
            if second > 55 { try await Task.sleep(for: .seconds(61 - second)) }
            let app = ingest.apps.apps[0]
            let post = postHash()
            let device = SecureRandom.hex(32)
            func register(key: String? = nil, bearer: String? = nil, token: String? = nil) async throws -> RawHTTPClient.Response {
                try await ingest.request("POST", Self.path, key: key, bearer: bearer,
                                         json: registration(token ?? (key == nil ? SecureRandom.hex(32) : device), post,
                                                            bundle: app.bundleID))
            }
            let alice = try ingest.apps.accessToken(for: app, subject: "alice")
            for caller in [(app.userKey, nil), (nil, alice)] as [(String?, String?)] {
                for _ in 0..<2 { #expect(try await register(key: caller.0, bearer: caller.1).status == 201) }
                let refused = try await register(key: caller.0, bearer: caller.1)
                #expect(refused.status == 429, "\(refused.text)")
                #expect(refused.errorCode == "rate_limited")
                #expect(refused.headers["retry-after"].flatMap(Int.init).map { (1...61).contains($0) } == true)
                #expect(refused.headers["ratelimit-remaining"] == "0")
            }
            // Another subject of the same app has its own window, and so has another device behind the same key.
            let bob = try await register(bearer: try ingest.apps.accessToken(for: app, subject: "bob"))
            #expect(bob.status == 201, "\(bob.text)")
            let otherDevice = try await register(key: app.userKey, token: SecureRandom.hex(32))
            #expect(otherDevice.status == 201, "\(otherDevice.text)")
            // The key's device registered twice (one registration renewed), alice twice, bob and the other device once.
            #expect(try await ingest.redis.command(["ZCARD", RedisKeys(app: app.id).post(post)]).int == 5,
                    "refused requests stored nothing")
        }
    }

    /// A registration refused for its body still counts, in the window of the valid push token it names: an app
    /// release sending a wrong bundle id does not use up the one window that requests naming no token share.
    @Test func aRefusedRegistrationCountsInThePushTokensWindow() async throws {
        try await withIngest { ingest in
            let second = Int(Date().timeIntervalSince1970) % 60
            if second > 55 { try await Task.sleep(for: .seconds(61 - second)) }
            let app = ingest.apps.apps[0]
            let token = SecureRandom.hex(32), post = postHash()
            func register(_ token: String, bundle: String) async throws -> RawHTTPClient.Response {
                try await ingest.request("POST", Self.path, key: app.userKey, json: registration(token, post, bundle: bundle))
            }
            let stored = try await register(token, bundle: app.bundleID)
            #expect(stored.status == 201 && stored.headers["ratelimit-remaining"] == "239", "\(stored.text)")
            let wrongBundle = try await register(token, bundle: "com.example.not-this-app")
            #expect(wrongBundle.status == 400, "\(wrongBundle.text)")
            #expect(wrongBundle.headers["ratelimit-remaining"] == "238", "counted with the token's registration")
            let otherToken = try await register(SecureRandom.hex(32), bundle: "com.example.not-this-app")
            #expect(otherToken.status == 400 && otherToken.headers["ratelimit-remaining"] == "239", "a window of its own")
            for expected in ["239", "238"] {
                let unnamed = try await register("not-a-token", bundle: app.bundleID)
                #expect(unnamed.status == 400 && unnamed.headers["ratelimit-remaining"] == expected, "the key's window for no token")
            }
        }
    }

    /// Every device reads a post's broadcast channel alike, naming no device: a public key's reads count in its
    /// app-wide ceiling alone, so one device reading again and again never locks the others out.
    @Test func broadcastChannelReadsCountInThePublicKeysCeilingOnly() async throws {
        let ingest = try await IngestHarness.start(rateLimit: 2, appRateLimit: 5)
        defer { Task { await ingest.stop() } }
        let second = Int(Date().timeIntervalSince1970) % 60
        if second > 50 { try await Task.sleep(for: .seconds(61 - second)) }
        let app = ingest.apps.apps[0]
        let path = "/v1/apps/\(app.id)/activities/\(postHash())/broadcast?environment=production"
        var statuses: [Int] = [], limits: [String?] = [], remaining: [String?] = []
        for _ in 1...6 {
            let read = try await ingest.request("GET", path, key: app.publicKey)
            statuses.append(read.status)
            limits.append(read.headers["ratelimit-limit"])
            remaining.append(read.headers["ratelimit-remaining"])
        }
        #expect(statuses == [404, 404, 404, 404, 404, 429], "the post has no channel; the sixth read is over the ceiling")
        #expect(limits == Array(repeating: "5", count: 6))
        #expect(remaining == ["4", "3", "2", "1", "0", "0"])
        // A secret key is one caller: its own window of 2.
        let secret = try await ingest.request("GET", path, key: app.secretKey)
        #expect(secret.status == 404 && secret.headers["ratelimit-limit"] == "2", "\(secret.status) \(secret.headers)")
    }

    /// A producer asking for a post's existing channel again (200) marks the post in use, as an update does: the
    /// janitor deletes only channels of posts idle that long.
    @Test func askingForAnExistingChannelMarksThePostInUse() async throws {
        let ingest = try await IngestHarness.start()
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0], post = postHash()
        let channel = BroadcastChannel(channelID: "ZXhpc3RpbmctY2hubA==", environment: .production,
                                       storagePolicy: .noStorage, createdAt: "2026-12-01T00:00:00Z")
        let channels = BroadcastChannelStore(redis: ingest.redis)
        _ = try await channels.save(app: app.id, postIDHash: post, channel)
        // Made two days ago and never used since.
        let old = Int64(Date().timeIntervalSince1970 * 1000) - 2 * 86_400_000
        _ = try await ingest.redis.command(["ZADD", RedisKeys(app: app.id).broadcastIndex, String(old), post])
        let asked = try await ingest.request("POST", "/v1/apps/\(app.id)/activities/\(post)/broadcast", key: app.secretKey,
                                             json: #"{"environment": "production", "storagePolicy": "noStorage"}"#)
        #expect(asked.status == 200, "\(asked.status) \(asked.text)")
        let used = try #require(try await channels.lastUsed(app: app.id, postIDHash: post))
        #expect(Int64(Date().timeIntervalSince1970 * 1000) - used < 60_000, "marked in use now")
    }

    /// A refusal saved by an earlier request's job (one that ran after that request had given up with 503) is not
    /// the answer to this request's own job: it waits for its own, here until its wait runs out.
    @Test func anEarlierJobsRefusalIsNotThisRequestsAnswer() async throws {
        let ingest = try await IngestHarness.start(broadcastChannelWait: .seconds(2))
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0], post = postHash()
        let channels = BroadcastChannelStore(redis: ingest.redis)
        let refusing = Task {
            // After the request has looked for a refusal (and cleared it) and published its job.
            try await Task.sleep(for: .milliseconds(600))
            try await channels.saveRefusal(app: app.id, postIDHash: post, environment: .production,
                                           reason: "FeatureNotEnabled", message: "an earlier job's", jobID: "earlier-job")
        }
        let asked = try await ingest.request("POST", "/v1/apps/\(app.id)/activities/\(post)/broadcast", key: app.secretKey,
                                             json: #"{"environment": "production"}"#)
        try await refusing.value
        #expect(asked.status == 503, "\(asked.status) \(asked.text)")
        guard case .refused(_, _, let jobID) = try await channels.state(app: app.id, postIDHash: post, environment: .production)
        else { Issue.record("the earlier job's refusal is left as it was"); return }
        #expect(jobID == "earlier-job")
    }

    // MARK: Logs

    /// Runs the real `herald-ingest` at debug level, sends it registrations (accepted, renewed, refused for every
    /// reason), stops it, and scans everything it wrote for the push token.
    @Test func theExecutableNeverLogsThePushToken() async throws {
        let apps = try TestApps(count: 1)
        defer { apps.remove() }
        let app = apps.apps[0]
        let executable = try ingestExecutable()
        let logURL = apps.folder.appendingPathComponent("ingest.log")
        _ = FileManager.default.createFile(atPath: logURL.path, contents: nil)
        let log = try FileHandle(forWritingTo: logURL)
        let process = Process()
        process.executableURL = executable
        process.environment = ProcessInfo.processInfo.environment.merging([
            "HERALD_INGEST_ADDR": "127.0.0.1:0", "HERALD_APPS_FILE": apps.path, "HERALD_JOB_SIGNING_SECRET_FILE": apps.jobSigningSecretPath, "HERALD_LOG_LEVEL": "debug",
            "HERALD_REDIS_URL": try TestEnvironment.redisURL(), "HERALD_KAFKA_BROKERS": try TestEnvironment.kafkaBrokers(),
            "HERALD_RATE_LIMIT_PER_MINUTE": "10",
        ]) { _, new in new }
        process.standardOutput = log
        process.standardError = log
        try process.run()
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }

        let port = try await listeningPort(logURL)
        let token = SecureRandom.hex(32), post = postHash()
        func send(_ body: String, key: String? = app.userKey, bearer: String? = nil) async throws -> Int {
            var headers = ["Content-Type": "application/json"]
            if let key { headers["X-API-Key"] = key }
            if let bearer { headers["Authorization"] = "Bearer \(bearer)" }
            let sent = headers
            let response = try await onThread { try RawHTTPClient(port: port).request("POST", Self.path, headers: sent, body: body) }
            #expect(!response.text.lowercased().contains(token), "\(response.text)")
            return response.status
        }
        #expect(try await send(registration(token, post, bundle: app.bundleID)) == 201)
        #expect(try await send(registration(token.uppercased(), post, bundle: app.bundleID)) == 201)
        #expect(try await send(registration(token, post, bundle: app.bundleID), key: nil,
                               bearer: try apps.accessToken(for: app)) == 201)
        for bad in [registration(token + "zz", post, bundle: app.bundleID), registration(token + "a", post, bundle: app.bundleID),
                    registration(token, post, bundle: "com.other.app"), registration(token, "NOTHEX", bundle: app.bundleID),
                    registration(token, post, environment: "dev", bundle: app.bundleID),
                    #"{"push_token": "\#(token)", "post_id_hash": "\#(post)", "bundle_id": "\#(app.bundleID)", "x": 1}"#,
                    #"{"push_token": "\#(token)", "#] {
            #expect(try await send(bad) == 400)
        }
        #expect(try await send(registration(token, post, bundle: app.bundleID), key: NewAPIKey.generate(kind: .public).key) == 401)
        #expect(try await send(registration(token, post, bundle: app.bundleID), key: nil,
                               bearer: try apps.accessToken(for: app, scope: "profile")) == 403)
        // 10 requests of the key so far; 15 more cross the limit of 10 even if a minute window ends meanwhile.
        var refused = 0
        for _ in 0..<15 {
            if try await send(registration(token, post, bundle: app.bundleID)) == 429 { refused += 1 }
        }
        #expect(refused > 0)

        process.terminate()
        let deadline = ContinuousClock.now + .seconds(15)
        while process.isRunning, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(50)) }
        #expect(!process.isRunning, "herald-ingest did not stop on SIGTERM")
        try log.close()
        let written = try String(contentsOf: logURL, encoding: .utf8)
        // The scan must have something to scan: the registrations were logged, by tag.
        #expect(written.contains("activity registered") && written.contains("activity registration renewed"), "\(written)")
        #expect(written.contains(Redaction.tag(token)))
        let lowered = written.lowercased()
        for fragment in [token, String(token.prefix(16)), String(token.suffix(16))] {
            let leaked = lowered.contains(fragment)
            #expect(!leaked, "the log holds (part of) the push token")
        }
    }
}

// MARK: Helpers

/// Starts an ingest service for `body` and stops it afterwards, whether `body` threw or not.
private func withIngest(rateLimit: Int = 240, activityTTL: Duration = .seconds(3600), apps: TestApps? = nil,
                        _ body: (IngestHarness) async throws -> Void) async throws {
    let ingest = try await IngestHarness.start(rateLimit: rateLimit, activityTTL: activityTTL, apps: apps)
    do { try await body(ingest) } catch {
        await ingest.stop()
        throw error
    }
    await ingest.stop()
}

/// A fresh post id hash: a 16-hex-digit SHA-256 prefix.
private func postHash() -> String { String(SHA256.hex(SecureRandom.hex(8)).prefix(16)) }

private func registration(_ token: String, _ post: String, environment: String? = nil, bundle: String) -> String {
    let environmentField = environment.map { #", "apns_environment": "\#($0)""# } ?? ""
    return #"{"push_token": "\#(token)", "post_id_hash": "\#(post)"\#(environmentField), "bundle_id": "\#(bundle)"}"#
}

/// Every Redis key of `app` (registrations and indexes; rate-limit windows live elsewhere).
/// The app's stored records (rate-limit counters, which share the app's hash slot, left out).
/// The app's keys on every master (`herald:{app}:…` and `herald:{app:…}…`), rate-limit counters left out.
private func storedKeys(_ ingest: IngestHarness, app: String) async throws -> [String] {
    var keys: [String] = []
    for master in try await ingest.redis.masters() {
        keys += try await master.command(["KEYS", "herald:{\(app)[:}]*"]).strings ?? []
    }
    return keys.filter { !$0.contains(":rl:") }
}

/// `herald_ingest_activity_registrations_total` by outcome, from `/metrics`.
private func registrationMetrics(_ ingest: IngestHarness) async throws -> (new: Double, renewed: Double) {
    let text = try await ingest.request("GET", "/metrics").text
    func value(_ outcome: String) -> Double {
        let prefix = "herald_ingest_activity_registrations_total{outcome=\"\(outcome)\"} "
        return text.split(separator: "\n").first { $0.hasPrefix(prefix) }.flatMap { Double($0.dropFirst(prefix.count)) } ?? 0
    }
    return (value("new"), value("renewed"))
}

/// HMAC-SHA256 of `message` keyed with the PEM text, base64url: the classic RS/ES-to-HS algorithm-confusion forgery.
private func hmacSHA256(_ message: String, keyPEM: String) throws -> String {
    let script = """
        import base64, hashlib, hmac, sys
        key = sys.argv[1].encode()
        digest = hmac.new(key, sys.stdin.buffer.read(), hashlib.sha256).digest()
        print(base64.urlsafe_b64encode(digest).decode().rstrip("="), end="")
        """
    return try runTool("python3", ["-c", script, keyPEM], input: Data(message.utf8))
}

extension ActivitiesAPITests {
    /// The JSON pointer of the registration operation's `status` response body schema.
    static func responseSchema(_ status: Int) -> String {
        "#/paths/~1api~1v1~1activities~1register/post/responses/\(status)/content/application~1json/schema"
    }
}
