import Foundation
import HeraldCore
import HeraldCrypto
import HeraldRedis
import HeraldRuntime
import HeraldTestSupport
import Testing

/// The device subscriptions API end to end: herald-ingest in-process against the real Redis of `scripts/test`.
/// Each test checks what a client sees (status, error code and field, headers) and what Redis holds afterwards.
@Suite struct SubscriptionsAPITests {
    // MARK: Upsert, list, remove

    @Test func createsThenUpdatesTheSameSubscription() async throws {
        let ingest = try await IngestHarness.start()
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let token = deviceToken()
        let path = "/v1/apps/\(app.id)/subscriptions"

        let created = try await ingest.request("POST", path, key: app.publicKey, json: body([
            "channel": "order:42:status", "deviceToken": token.uppercased(), "tokenType": "alert",
            "environment": "sandbox", "metadata": ["locale": "en_US"],
        ]))
        #expect(created.status == 201, "\(created.text)")
        let first = try created.json()
        let id = try #require(first["id"] as? String)
        #expect(first["channel"] as? String == "order:42:status")
        #expect(first["deviceToken"] as? String == token, "stored lowercase")
        #expect(first["tokenType"] as? String == "alert")
        #expect(first["environment"] as? String == "sandbox")
        #expect((first["metadata"] as? [String: Any])?["locale"] as? String == "en_US")
        #expect(first["createdAt"] as? String == first["updatedAt"] as? String)
        #expect(created.headers["ratelimit-limit"] == "240")
        #expect(created.headers["ratelimit-remaining"] == "239")
        #expect(created.headers["x-request-id"]?.isEmpty == false)
        let keys = StoredKeys(app: app.id)
        #expect(try await targets(ingest.redis, keys.channel("order:42:status")) == [id: "as" + token])

        // The same (token, tokenType, channel), in another letter case and with new fields: an update.
        let updated = try await ingest.request("POST", path, key: app.publicKey, json: body([
            "channel": "order:42:status", "deviceToken": token, "tokenType": "alert", "metadata": ["locale": "fr_FR"],
        ]))
        #expect(updated.status == 200, "\(updated.text)")
        let second = try updated.json()
        #expect(second["id"] as? String == id)
        #expect(second["createdAt"] as? String == first["createdAt"] as? String)
        #expect(second["environment"] as? String == "production", "the default when not given")
        #expect((second["metadata"] as? [String: Any])?["locale"] as? String == "fr_FR")

        #expect(try await keys.subscriptionKeys(ingest.redis) == [keys.subscription(id, token: token)])
        // The update rewrote the channel index's target: the environment went back to production.
        #expect(try await targets(ingest.redis, keys.channel("order:42:status")) == [id: "ap" + token])
        #expect(try await members(ingest.redis, keys.device(token)) == [id])
        let stored = try #require(try await ingest.redis.command(["HGETALL", keys.subscription(id, token: token)]).fieldValues)
        #expect(stored["deviceToken"] == token)
        #expect(stored["environment"] == "production")
        #expect(stored["metadata"] == #"{"locale":"fr_FR"}"#)
    }

    @Test func concurrentPostsOfOneSubscriptionCreateItOnce() async throws {
        let ingest = try await IngestHarness.start()
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let json = body(["channel": "news", "deviceToken": deviceToken(), "tokenType": "alert"])
        let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    try await ingest.request("POST", "/v1/apps/\(app.id)/subscriptions", key: app.publicKey, json: json).status
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(statuses.sorted() == [200, 200, 200, 200, 200, 200, 200, 201])
        let stored = try await StoredKeys(app: app.id).subscriptionKeys(ingest.redis)
        #expect(stored.count == 1)
    }

    @Test func listsADevicesSubscriptions() async throws {
        let ingest = try await IngestHarness.start()
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let token = deviceToken(), other = deviceToken()
        try await subscribe(ingest, app, token, "news")
        try await subscribe(ingest, app, token, "sports")
        try await subscribe(ingest, app, token, "news", type: "liveactivity-update", activityID: "match-7")
        try await subscribe(ingest, app, other, "news")

        let listed = try await ingest.request("GET", "/v1/apps/\(app.id)/subscriptions?deviceToken=\(token.uppercased())",
                                              key: app.publicKey)
        #expect(listed.status == 200, "\(listed.text)")
        let subscriptions = try #require(try listed.json()["subscriptions"] as? [[String: Any]])
        #expect(Set(subscriptions.map { "\($0["channel"]!)/\($0["tokenType"]!)" })
                == ["news/alert", "sports/alert", "news/liveactivity-update"])
        #expect(subscriptions.allSatisfy { $0["deviceToken"] as? String == token })
        #expect(subscriptions.compactMap { $0["activityID"] as? String } == ["match-7"])

        let none = try await ingest.request("GET", "/v1/apps/\(app.id)/subscriptions?deviceToken=\(deviceToken())",
                                            key: app.publicKey)
        #expect(none.status == 200)
        #expect((try none.json()["subscriptions"] as? [Any])?.isEmpty == true)
    }

    /// The channel index holds what a push needs: an update that changes the environment or the activityID
    /// rewrites it, and an activityID with the separator, spaces and non-ASCII text in it is stored as given.
    @Test func channelIndexFollowsEnvironmentAndActivityChanges() async throws {
        let ingest = try await IngestHarness.start()
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let token = deviceToken()
        let keys = StoredKeys(app: app.id)
        let id = try await subscribe(ingest, app, token, "match", type: "liveactivity-update", activityID: "match-7")
        #expect(try await targets(ingest.redis, keys.channel("match")) == [id: "up" + token + ":match-7"])
        let odd = "m:8 é/\\\"🙂:"
        let response = try await ingest.request("POST", "/v1/apps/\(app.id)/subscriptions", key: app.publicKey, json: body([
            "channel": "match", "deviceToken": token, "tokenType": "liveactivity-update", "activityID": odd,
            "environment": "sandbox",
        ]))
        #expect(response.status == 200, "\(response.text)")
        #expect(try await targets(ingest.redis, keys.channel("match")) == [id: "us" + token + ":" + odd])
    }

    @Test func removesOneSubscription() async throws {
        let ingest = try await IngestHarness.start()
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let token = deviceToken()
        let newsID = try await subscribe(ingest, app, token, "news")
        let sportsID = try await subscribe(ingest, app, token, "sports")
        let liveID = try await subscribe(ingest, app, token, "news", type: "liveactivity-start")
        let path = "/v1/apps/\(app.id)/subscriptions"

        let removed = try await ingest.request("DELETE", path, key: app.publicKey,
                                               json: body(["deviceToken": token, "channel": "news", "tokenType": "alert"]))
        #expect(removed.status == 200, "\(removed.text)")
        #expect(try removed.json()["removed"] as? Int == 1)

        let keys = StoredKeys(app: app.id)
        #expect(try await ingest.redis.command(["EXISTS", keys.subscription(newsID, token: token)]).int == 0)
        #expect(try await targets(ingest.redis, keys.channel("news")) == [liveID: "sp" + token])
        #expect(try await members(ingest.redis, keys.device(token)) == [liveID, sportsID].sorted())

        let again = try await ingest.request("DELETE", path, key: app.publicKey,
                                             json: body(["deviceToken": token, "channel": "news", "tokenType": "alert"]))
        #expect(again.status == 200)
        #expect(try again.json()["removed"] as? Int == 0)
    }

    @Test func removesEverySubscriptionOfADevice() async throws {
        let ingest = try await IngestHarness.start()
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let token = deviceToken(), other = deviceToken()
        for channel in ["a", "b", "c"] { try await subscribe(ingest, app, token, channel) }
        try await subscribe(ingest, app, token, "a", type: "liveactivity-start")
        let kept = try await subscribe(ingest, app, other, "a")
        let path = "/v1/apps/\(app.id)/subscriptions"

        let removed = try await ingest.request("DELETE", path, key: app.publicKey, json: body(["deviceToken": token]))
        #expect(removed.status == 200, "\(removed.text)")
        #expect(try removed.json()["removed"] as? Int == 4)

        let keys = StoredKeys(app: app.id)
        #expect(try await keys.subscriptionKeys(ingest.redis) == [keys.subscription(kept, token: other)])
        for gone in [keys.device(token), keys.channel("b"), keys.channel("c")] {
            #expect(try await ingest.redis.command(["EXISTS", gone]).int == 0)
        }
        #expect(try await targets(ingest.redis, keys.channel("a")) == [kept: "ap" + other])

        let again = try await ingest.request("DELETE", path, key: app.publicKey, json: body(["deviceToken": token]))
        #expect(try again.json()["removed"] as? Int == 0)
    }

    @Test func rotationRemovesOnlyTheOldTokensSubscriptionsOfTheSameType() async throws {
        let ingest = try await IngestHarness.start()
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0], otherApp = ingest.apps.apps[1]
        let old = deviceToken(), new = deviceToken()
        try await subscribe(ingest, app, old, "news")
        try await subscribe(ingest, app, old, "sports")
        let start = try await subscribe(ingest, app, old, "news", type: "liveactivity-start")
        let elsewhere = try await subscribe(ingest, otherApp, old, "news")

        let rotated = try await ingest.request("POST", "/v1/apps/\(app.id)/subscriptions", key: app.publicKey, json: body([
            "channel": "news", "deviceToken": new, "tokenType": "alert", "previousToken": old.uppercased(),
        ]))
        #expect(rotated.status == 201, "\(rotated.text)")
        let newID = try #require(try rotated.json()["id"] as? String)

        #expect(try await list(ingest, app, old).map(\.id) == [start])
        #expect(try await list(ingest, app, new).map(\.id) == [newID])
        let keys = StoredKeys(app: app.id)
        #expect(try await targets(ingest.redis, keys.channel("news")) == [newID: "ap" + new, start: "sp" + old])
        #expect(try await ingest.redis.command(["EXISTS", keys.channel("sports")]).int == 0)
        #expect(try await members(ingest.redis, keys.device(old)) == [start])
        #expect(try await list(ingest, otherApp, old).map(\.id) == [elsewhere], "another app's subscriptions stay")

        // previousToken equal to deviceToken is not a rotation: nothing is removed.
        let same = try await ingest.request("POST", "/v1/apps/\(app.id)/subscriptions", key: app.publicKey, json: body([
            "channel": "news", "deviceToken": new, "tokenType": "alert", "previousToken": new,
        ]))
        #expect(same.status == 200, "\(same.text)")
        #expect(try await list(ingest, app, new).map(\.id) == [newID])
    }

    // MARK: Validation

    /// A request the API must refuse, and how.
    struct Refusal: Sendable, CustomStringConvertible {
        var name: String
        var method = "POST"
        var body: String
        var contentType = "application/json"
        var status = 400
        var code: String
        var field: String?
        var description: String { name }
    }

    static func postRefusals(token: String, existing: String) -> [Refusal] {
        func post(_ name: String, _ fields: [String: Any], code: String = "invalid_field", field: String?,
                  dropping: [String] = []) -> Refusal {
            var all: [String: Any] = ["channel": "news", "deviceToken": token, "tokenType": "alert"]
            for (name, value) in fields { all[name] = value }
            for name in dropping { all.removeValue(forKey: name) }
            return Refusal(name: name, body: body(all), code: code, field: field)
        }
        return [
            post("channel of 256 characters", ["channel": String(repeating: "c", count: 256)], field: "channel"),
            post("channel of 256 code points in 128 characters",
                 ["channel": String(repeating: "e\u{301}", count: 128)], field: "channel"),
            post("channel with a C1 control character", ["channel": "news\u{85}"], field: "channel"),
            post("channel with a control character", ["channel": "news\u{1}"], field: "channel"),
            post("channel with a newline", ["channel": "news\nsports"], field: "channel"),
            post("channel with DEL", ["channel": "news\u{7f}"], field: "channel"),
            post("empty channel", ["channel": ""], code: "missing_field", field: "channel"),
            post("channel not a string", ["channel": 42], field: "channel"),
            post("no channel", [:], code: "missing_field", field: "channel", dropping: ["channel"]),
            post("odd-length token", ["deviceToken": token + "a"], field: "deviceToken"),
            post("non-hex token", ["deviceToken": String(repeating: "zz", count: 32)], field: "deviceToken"),
            post("token too short", ["deviceToken": "abcd"], field: "deviceToken"),
            post("token too long", ["deviceToken": String(repeating: "ab", count: 101)], field: "deviceToken"),
            post("no token", [:], code: "missing_field", field: "deviceToken", dropping: ["deviceToken"]),
            post("unknown tokenType", ["tokenType": "voip"], field: "tokenType"),
            post("no tokenType", [:], code: "missing_field", field: "tokenType", dropping: ["tokenType"]),
            post("liveactivity-update without activityID", ["tokenType": "liveactivity-update"],
                 code: "missing_field", field: "activityID"),
            post("empty activityID", ["tokenType": "liveactivity-update", "activityID": ""], field: "activityID"),
            post("unknown environment", ["environment": "staging"], field: "environment"),
            post("metadata an array", ["metadata": [1, 2]], field: "metadata"),
            post("metadata a string", ["metadata": "x"], field: "metadata"),
            post("metadata over 4 KiB", ["metadata": ["note": String(repeating: "m", count: 4100)]], field: "metadata"),
            // A rotation with a bad previousToken must not remove the existing token's subscriptions.
            post("non-hex previousToken", ["previousToken": "xyz"], field: "previousToken"),
            post("odd-length previousToken", ["previousToken": existing + "0"], field: "previousToken"),
            post("rotation with a bad channel", ["previousToken": existing, "channel": "\u{0}"], field: "channel"),
            post("unknown field", ["colour": "red"], code: "unknown_field", field: "colour"),
            Refusal(name: "malformed JSON", body: #"{"channel": "news", "deviceToken": "#, code: "invalid_json"),
            Refusal(name: "empty body", body: "", code: "invalid_json"),
            Refusal(name: "body not an object", body: "[1, 2]", code: "invalid_body"),
            Refusal(name: "oversize body", body: body(["channel": "news", "deviceToken": token, "tokenType": "alert",
                                                      "metadata": ["pad": String(repeating: "p", count: 70_000)]]),
                    status: 413, code: "body_too_large"),
            Refusal(name: "not JSON", body: "channel=news", contentType: "application/x-www-form-urlencoded",
                    status: 415, code: "unsupported_media_type"),
        ]
    }

    static func deleteRefusals(token: String) -> [Refusal] {
        func delete(_ name: String, _ fields: [String: Any], code: String = "invalid_field", field: String?) -> Refusal {
            Refusal(name: "DELETE: " + name, method: "DELETE", body: body(fields), code: code, field: field)
        }
        return [
            delete("no deviceToken", ["channel": "news", "tokenType": "alert"], code: "missing_field", field: "deviceToken"),
            delete("non-hex token", ["deviceToken": "not-hex"], field: "deviceToken"),
            delete("channel without tokenType", ["deviceToken": token, "channel": "news"], field: "tokenType"),
            delete("tokenType without channel", ["deviceToken": token, "tokenType": "alert"], field: "channel"),
            delete("unknown tokenType", ["deviceToken": token, "channel": "news", "tokenType": "voip"], field: "tokenType"),
            delete("channel of 256 characters", ["deviceToken": token, "channel": String(repeating: "c", count: 256),
                                                 "tokenType": "alert"], field: "channel"),
            delete("unknown field", ["deviceToken": token, "everything": true], code: "unknown_field", field: "everything"),
            Refusal(name: "DELETE: malformed JSON", method: "DELETE", body: "{", code: "invalid_json"),
            Refusal(name: "DELETE: not JSON", method: "DELETE", body: "deviceToken=\(token)", contentType: "text/plain",
                    status: 415, code: "unsupported_media_type"),
        ]
    }

    @Test func refusesBadInputAndChangesNothing() async throws {
        let ingest = try await IngestHarness.start()
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let token = deviceToken()
        // Existing state a wrong request could disturb: the token's own subscriptions on both channels used.
        try await subscribe(ingest, app, token, "news")
        try await subscribe(ingest, app, token, "sports", type: "liveactivity-start")
        let before = try await storedState(ingest.redis, app: app.id)
        let path = "/v1/apps/\(app.id)/subscriptions"

        for refusal in Self.postRefusals(token: deviceToken(), existing: token) + Self.deleteRefusals(token: token) {
            let response = try await ingest.request(refusal.method, path, key: app.publicKey, json: refusal.body,
                                                    headers: ["Content-Type": refusal.contentType])
            #expect(response.status == refusal.status, "\(refusal): \(response.text)")
            #expect(response.errorCode == refusal.code, "\(refusal): \(response.text)")
            #expect(response.errorField == refusal.field, "\(refusal): \(response.text)")
            if refusal.status == 400 {
                #expect(response.headers["ratelimit-remaining"] != nil, "\(refusal): rate-limit headers on errors too")
            }
            #expect(try await storedState(ingest.redis, app: app.id) == before, "\(refusal) changed Redis")
        }
        // The rotation refused above left the token's subscriptions in place.
        #expect(try await list(ingest, app, token).count == 2)

        let noToken = try await ingest.request("GET", path, key: app.publicKey)
        #expect(noToken.status == 400)
        #expect(noToken.errorCode == "missing_field" && noToken.errorField == "deviceToken", "\(noToken.text)")
        let badToken = try await ingest.request("GET", path + "?deviceToken=abc", key: app.publicKey)
        #expect(badToken.status == 400)
        #expect(badToken.errorCode == "invalid_field" && badToken.errorField == "deviceToken", "\(badToken.text)")
    }

    @Test func acceptsTheLimitsThemselves() async throws {
        let ingest = try await IngestHarness.start()
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        // 255 characters, multi-byte ones included, and metadata just under 4 KiB of JSON.
        let channel = String(repeating: "é", count: 200) + String(repeating: "c", count: 55)
        let metadata = ["note": String(repeating: "m", count: 4096 - #"{"note":""}"#.utf8.count)]
        let response = try await ingest.request("POST", "/v1/apps/\(app.id)/subscriptions", key: app.publicKey, json: body([
            "channel": channel, "deviceToken": deviceToken(), "tokenType": "liveactivity-update", "activityID": "a",
            "metadata": metadata,
        ]))
        #expect(response.status == 201, "\(response.text)")
        #expect(try response.json()["channel"] as? String == channel)
    }

    // MARK: Auth, rate limit, tenants

    @Test func refusesMissingUnknownAndForeignKeys() async throws {
        let ingest = try await IngestHarness.start()
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0], other = ingest.apps.apps[1]
        let path = "/v1/apps/\(app.id)/subscriptions"
        let subscription = body(["channel": "news", "deviceToken": deviceToken(), "tokenType": "alert"])

        let none = try await ingest.request("POST", path, json: subscription)
        #expect(none.status == 401)
        #expect(none.errorCode == "unauthorized")
        let unknown = try await ingest.request("POST", path, key: "hrd_pub_" + deviceToken(), json: subscription)
        #expect(unknown.status == 401)
        #expect(unknown.errorCode == "unauthorized")
        let wrongScheme = try await ingest.request("POST", path, json: subscription,
                                                   headers: ["Authorization": "Basic \(app.publicKey)"])
        #expect(wrongScheme.status == 401)
        let foreign = try await ingest.request("POST", path, key: other.publicKey, json: subscription)
        #expect(foreign.status == 403)
        #expect(foreign.errorCode == "forbidden")
        let noSuchApp = try await ingest.request("POST", "/v1/apps/no-such-app/subscriptions", key: app.publicKey,
                                                 json: subscription)
        // The same answer for an app that exists and one that does not: nothing to probe app ids with.
        #expect(noSuchApp.status == 403 && noSuchApp.errorCode == "forbidden")
        #expect(try await storedState(ingest.redis, app: app.id).isEmpty)

        // Both headers and both key kinds get in.
        let bearer = try await ingest.request("POST", path, bearer: app.publicKey, json: subscription)
        #expect(bearer.status == 201, "\(bearer.text)")
        let secret = try await ingest.request("POST", path, key: app.secretKey, json: subscription)
        #expect(secret.status == 200, "\(secret.text)")
    }

    /// A public key is in every copy of the app: it counts per device token. 250 devices sharing the key all get
    /// in; the 241st request of one device in a window gets 429, and that device's refusals leave the others alone.
    @Test func aPublicKeyCountsPerDeviceAnd241RequestsOfOneDeviceGet429() async throws {
        let ingest = try await IngestHarness.start()
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        // All requests must fall in one fixed 60 s window: they take about a second (several under a sanitizer),
        // so with less than 15 s of this one left, start in the next.
        let intoWindow = Int(Date().timeIntervalSince1970) % 60
        if intoWindow >= 45 { try await Task.sleep(for: .seconds(61 - intoWindow)) }

        let port = ingest.port, key = app.publicKey, path = "/v1/apps/\(app.id)/subscriptions"
        let abuser = deviceToken()
        let (devices, repeated) = try await onThread {
            let client = try RawHTTPClient(port: port)  // one keep-alive connection
            func subscribe(_ token: String, _ channel: String) throws -> RawHTTPClient.Response {
                try client.request("POST", path, headers: ["X-API-Key": key, "Content-Type": "application/json"],
                                   body: #"{"channel": "\#(channel)", "deviceToken": "\#(token)", "tokenType": "alert"}"#)
            }
            let devices = try (1...250).map { n in try subscribe(deviceToken(), "c\(n)") }
            let repeated = try (1...241).map { n in try subscribe(abuser, "c\(n)") }
            return (devices, repeated)
        }
        #expect(devices.allSatisfy { $0.status == 201 }, "\(devices.map(\.status).filter { $0 != 201 })")
        #expect(devices.allSatisfy { $0.headers["ratelimit-remaining"] == "239" }, "each device has its own window")
        #expect(repeated.prefix(240).allSatisfy { $0.status == 201 })
        #expect(repeated[0].headers["ratelimit-remaining"] == "239")
        #expect(repeated[99].headers["ratelimit-remaining"] == "140")
        #expect(repeated[239].headers["ratelimit-remaining"] == "0")
        for refused in repeated.suffix(1) {
            #expect(refused.status == 429, "\(refused.text)")
            #expect(refused.errorCode == "rate_limited")
            let retryAfter = try #require(refused.headers["retry-after"].flatMap(Int.init))
            #expect((1...60).contains(retryAfter))
            #expect(refused.headers["ratelimit-limit"] == "240")
            #expect(refused.headers["ratelimit-remaining"] == "0")
            #expect(refused.headers["ratelimit-reset"] == String(retryAfter))
        }
        let stored = try await StoredKeys(app: app.id).subscriptionKeys(ingest.redis)
        #expect(stored.count == 250 + 240, "the refused request stored nothing")

        // A request that does not say which device (bad input) counts in the key's one window for those.
        let bad = try await ingest.request("POST", path, key: app.publicKey, json: #"{"channel": "c", "deviceToken": "not-hex"}"#)
        #expect(bad.status == 400 && bad.headers["ratelimit-remaining"] == "239", "\(bad.status) \(bad.headers)")
        // One that names a valid device counts in that device's window: a release sending bad bodies does not use up
        // the window every device's refusals would share.
        let named = try await ingest.request("POST", path, key: app.publicKey,
                                             json: #"{"channel": "", "deviceToken": "\#(deviceToken())", "tokenType": "alert"}"#)
        #expect(named.status == 400 && named.headers["ratelimit-remaining"] == "239", "\(named.status) \(named.headers)")

        // The abuser is refused; another device behind the same key still gets in, and so does the secret key.
        let other = try await ingest.request("GET", path + "?deviceToken=\(deviceToken())", key: app.publicKey)
        #expect(other.status == 200 && other.headers["ratelimit-remaining"] == "239")
        let abuserAgain = try await ingest.request("GET", path + "?deviceToken=\(abuser)", key: app.publicKey)
        #expect(abuserAgain.status == 429)
        let secret = try await ingest.request("GET", path + "?deviceToken=\(abuser)", key: app.secretKey)
        #expect(secret.status == 200 && secret.headers["ratelimit-remaining"] == "239")

        let metrics = try await ingest.request("GET", "/metrics").text
        #expect(metrics.contains(#"herald_http_requests_total{route="/v1/apps/{appID}/subscriptions",method="POST",status="429"}"#))
        #expect(metrics.contains(#"herald_http_request_duration_seconds_bucket{route="/v1/apps/{appID}/subscriptions""#))
        #expect(metrics.contains("herald_ingest_rate_limited_total "))
    }

    /// The app-wide ceiling of a public key: past it every device is refused, and the headers describe it.
    @Test func aPublicKeysAppWideCeilingRefusesEveryDevice() async throws {
        let ingest = try await IngestHarness.start(appRateLimit: 5)
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let intoWindow = Int(Date().timeIntervalSince1970) % 60
        if intoWindow > 50 { try await Task.sleep(for: .seconds(61 - intoWindow)) }
        let path = "/v1/apps/\(app.id)/subscriptions"
        var statuses: [Int] = [], remaining: [String?] = [], limits: [String?] = []
        for n in 1...6 {
            let response = try await ingest.request("POST", path, key: app.publicKey,
                                                    json: #"{"channel": "c\#(n)", "deviceToken": "\#(deviceToken())", "tokenType": "alert"}"#)
            statuses.append(response.status)
            remaining.append(response.headers["ratelimit-remaining"])
            limits.append(response.headers["ratelimit-limit"])
        }
        #expect(statuses == [201, 201, 201, 201, 201, 429])
        #expect(remaining == ["4", "3", "2", "1", "0", "0"], "the window closer to its limit decides")
        #expect(limits == ["5", "5", "5", "5", "5", "5"])
        // Secret keys are not under the public key's ceiling.
        let secret = try await ingest.request("GET", path + "?deviceToken=\(deviceToken())", key: app.secretKey)
        #expect(secret.status == 200)
    }

    /// A subscribe whose script counted the request and then failed on the data (a channel index of the wrong
    /// type): the 500 says where the window stands, and the request is counted once, not again by the gatekeeper.
    @Test func aSubscribeThatFailsAfterCountingIsCountedOnce() async throws {
        let ingest = try await IngestHarness.start(rateLimit: 100)
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0], device = deviceToken(), broken = "broken:\(SecureRandom.hex(4))"
        let intoWindow = Int(Date().timeIntervalSince1970) % 60
        if intoWindow > 50 { try await Task.sleep(for: .seconds(61 - intoWindow)) }
        _ = try await ingest.redis.command(["SET", StoredKeys(app: app.id).channel(broken), "not an index"])
        let path = "/v1/apps/\(app.id)/subscriptions"
        let failed = try await ingest.request("POST", path, key: app.publicKey,
                                              json: #"{"channel": "\#(broken)", "deviceToken": "\#(device)", "tokenType": "alert"}"#)
        #expect(failed.status == 500, "\(failed.text)")
        #expect(failed.headers["ratelimit-remaining"] == "99", "\(failed.headers)")
        let next = try await ingest.request("POST", path, key: app.publicKey,
                                            json: #"{"channel": "fine", "deviceToken": "\#(device)", "tokenType": "alert"}"#)
        #expect(next.status == 201, "\(next.text)")
        #expect(next.headers["ratelimit-remaining"] == "98", "the failed request counted once: \(next.headers)")
    }

    // MARK: Bounded state

    /// 500 subscriptions of one device: the 501st is refused (409, nothing stored) while updates still work, and
    /// GET pages through them 100 (or `limit`) at a time with a cursor, each page a bounded size.
    @Test func aDeviceHasAtMost500SubscriptionsAndTheyArePaged() async throws {
        let ingest = try await IngestHarness.start(rateLimit: 100_000)
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let port = ingest.port, key = app.publicKey, path = "/v1/apps/\(app.id)/subscriptions", device = deviceToken()
        let statuses = try await onThread {
            let client = try RawHTTPClient(port: port)
            return try (1...501).map { n in
                try client.request("POST", path, headers: ["X-API-Key": key, "Content-Type": "application/json"],
                                   body: #"{"channel": "c\#(n)", "deviceToken": "\#(device)", "tokenType": "alert", "metadata": {"pad": "\#(String(repeating: "x", count: 2000))"}}"#).status
            }
        }
        #expect(statuses.prefix(500).allSatisfy { $0 == 201 })
        #expect(statuses.last == 409)
        let refused = try await ingest.request("POST", path, key: key,
                                               json: #"{"channel": "c501", "deviceToken": "\#(device)", "tokenType": "alert"}"#)
        #expect(refused.status == 409 && refused.errorCode == "too_many_subscriptions", "\(refused.text)")
        #expect(try await ingest.redis.command(["EXISTS", StoredKeys(app: app.id).channel("c501")]).int == 0)
        let update = try await ingest.request("POST", path, key: key,
                                              json: #"{"channel": "c1", "deviceToken": "\#(device)", "tokenType": "alert"}"#)
        #expect(update.status == 200, "an update is not a new subscription")

        var seen: Set<String> = [], cursor: String?, pages = 0, largest = 0
        repeat {
            let query = "?deviceToken=\(device)" + (cursor.map { "&cursor=\($0)" } ?? "")
            let page = try await ingest.request("GET", path + query, key: key)
            #expect(page.status == 200, "\(page.text)")
            let body = try page.json()
            let items = try #require(body["subscriptions"] as? [[String: Any]])
            #expect(items.count <= 100)
            seen.formUnion(items.compactMap { $0["id"] as? String })
            cursor = body["nextCursor"] as? String
            largest = max(largest, page.body.count)
            pages += 1
        } while cursor != nil && pages < 20
        // 100 of these (2.3 KB each) would pass 128 KiB: each page stops there, and its cursor goes on from it.
        #expect(pages > 5 && seen.count == 500, "\(pages) pages, \(seen.count) subscriptions")
        #expect(largest < 128 * 1024 + 2400, "a page stops at 128 KiB: \(largest) bytes")
        let wide = try await ingest.request("GET", path + "?deviceToken=\(device)&limit=500", key: key)
        let wideBody = try wide.json()
        let wideCount = (wideBody["subscriptions"] as? [Any])?.count ?? 0
        #expect(wideCount > 50 && wideCount < 500 && wideBody["nextCursor"] != nil, "\(wideCount)")
        for bad in ["limit=0", "limit=501", "limit=ten", "cursor=%21%21"] {
            let answer = try await ingest.request("GET", path + "?deviceToken=\(device)&\(bad)", key: key)
            #expect(answer.status == 400, "\(bad): \(answer.text)")
        }
        // Removing all 500 at once goes through in batches.
        let removed = try await ingest.request("DELETE", path, key: key, json: #"{"deviceToken": "\#(device)"}"#)
        let removedCount = try removed.json()["removed"] as? Int
        #expect(removed.status == 200 && removedCount == 500, "\(removed.text)")
    }

    /// A producer closes a channel: every subscription of it goes, and only a secret key may.
    @Test func closingAChannelRemovesItsSubscriptions() async throws {
        let ingest = try await IngestHarness.start(rateLimit: 10_000)
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let channel = "order:\(SecureRandom.hex(4)):status"
        let devices = (0..<3).map { _ in deviceToken() }
        for device in devices {
            _ = try await subscribe(ingest, app, device, channel)
            _ = try await subscribe(ingest, app, device, "news")
        }
        let encoded = channel.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? channel
        let asDevice = try await ingest.request("DELETE", "/v1/apps/\(app.id)/channels/\(encoded)", key: app.publicKey)
        #expect(asDevice.status == 403)
        let closed = try await ingest.request("DELETE", "/v1/apps/\(app.id)/channels/\(encoded)", key: app.secretKey)
        let closedCount = try closed.json()["removed"] as? Int
        #expect(closed.status == 200 && closedCount == 3, "\(closed.text)")
        #expect(try await ingest.redis.command(["EXISTS", StoredKeys(app: app.id).channel(channel)]).int == 0)
        for device in devices {
            let listed = try await ingest.request("GET", "/v1/apps/\(app.id)/subscriptions?deviceToken=\(device)", key: app.publicKey)
            let channels = (try listed.json()["subscriptions"] as? [[String: Any]])?.compactMap { $0["channel"] as? String }
            #expect(channels == ["news"])
        }
        let again = try await ingest.request("DELETE", "/v1/apps/\(app.id)/channels/\(encoded)", key: app.secretKey)
        let againCount = try again.json()["removed"] as? Int
        #expect(againCount == 0)
    }

    // MARK: Private channels

    /// Without a grant anyone with the public key could subscribe to every customer's order channel: a private
    /// channel needs a grant from the app's backend, for that channel, unexpired, signed with the app's secret.
    @Test func aPrivateChannelNeedsAValidGrantAndARefusalStoresNothing() async throws {
        let ingest = try await IngestHarness.start(rateLimit: 10_000)
        defer { Task { await ingest.stop() } }
        let (app, other) = (ingest.apps.apps[0], ingest.apps.apps[1])
        let path = "/v1/apps/\(app.id)/subscriptions", token = deviceToken()
        let channel = app.privateChannelPrefix + "order:\(SecureRandom.hex(4)):status"
        let now = Date().timeIntervalSince1970
        let secret = try SharedSecret(bytes: Array(app.grantSecret.utf8))
        func grant(_ claims: [String: JSONValue], secret: SharedSecret = secret) -> String {
            ChannelGrant.sign(claims: claims, secret: secret)
        }
        let valid: [String: JSONValue] = ["app": .string(app.id), "exp": .number(now + 600), "channel": .string(channel)]
        func subscribe(grant: String? = nil, header: String? = nil, channel: String = channel) async throws -> RawHTTPClient.Response {
            var fields: [String: Any] = ["channel": channel, "deviceToken": token, "tokenType": "alert"]
            if let grant { fields["channelGrant"] = grant }
            return try await ingest.request("POST", path, key: app.publicKey, json: body(fields),
                                            headers: header.map { ["X-Herald-Channel-Grant": $0] } ?? [:])
        }

        let missing = try await subscribe()
        #expect(missing.status == 403 && missing.errorCode == "channel_grant_required", "\(missing.text)")
        var forged = valid
        forged["exp"] = .number(now + 2 * 86_400)
        var expired = valid
        expired["exp"] = .number(now - 120)
        var noExpiry = valid
        noExpiry["exp"] = nil
        var otherChannel = valid
        otherChannel["channel"] = .string(channel + "x")
        var otherApp = valid
        otherApp["app"] = .string(other.id)
        let unsigned = Base64URL.encode(Array(#"{"alg":"none"}"#.utf8)) + "." + Base64URL.encode(JSONValue.object(valid).encoded()) + "."
        let rs256 = try JSONWebToken.sign(claims: valid, keyID: nil, key: app.oauthKey)
        for (name, bad) in [("another app's secret", grant(valid, secret: try SharedSecret(bytes: Array(other.grantSecret.utf8)))),
                            ("more than 24 h", grant(forged)), ("expired", grant(expired)), ("no exp", grant(noExpiry)),
                            ("another channel", grant(otherChannel)), ("another app", grant(otherApp)),
                            ("alg none", unsigned), ("RS256", rs256), ("garbage", "not.a.jwt")] {
            let refused = try await subscribe(grant: bad)
            #expect(refused.status == 403 && refused.errorCode == "invalid_channel_grant", "\(name): \(refused.text)")
        }
        #expect(try await storedState(ingest.redis, app: app.id).isEmpty, "a refused subscription stores nothing")

        #expect(try await subscribe(grant: grant(valid)).status == 201)
        #expect(try await subscribe(header: grant(valid)).status == 200, "the header works too")
        let wildcard = grant(["app": .string(app.id), "exp": .number(now + 600),
                              "channels": .array([.string("news"), .string(app.privateChannelPrefix + "order:*")])])
        #expect(try await subscribe(grant: wildcard, channel: app.privateChannelPrefix + "order:7:status").status == 201)
        #expect(try await subscribe(grant: wildcard, channel: app.privateChannelPrefix + "user:7").status == 403)
        // The README's example issues grants Herald accepts.
        let script = TestEnvironment.repositoryRoot.appendingPathComponent("examples/channel_grant.py").path
        let secretFile = ingest.apps.folder.appendingPathComponent("\(app.id)-grants.secret").path
        let issued = try await onThread {
            try runTool("python3", [script, "--secret-file", secretFile, "--app", app.id, "--channel", channel])
        }.trimmingCharacters(in: .whitespacesAndNewlines)
        let fromExample = try await subscribe(grant: issued)
        #expect(fromExample.status == 200, "\(fromExample.text)")
        // Public channels work as before, and the grant is not stored with the subscription.
        #expect(try await subscribe(channel: "order:\(SecureRandom.hex(4)):status").status == 201)
        let listed = try await ingest.request("GET", path + "?deviceToken=\(token)", key: app.publicKey)
        #expect(listed.status == 200 && !listed.text.contains("eyJ"), "\(listed.text)")
    }

    @Test func anAppCannotSeeOrChangeAnotherAppsSubscriptions() async throws {
        let ingest = try await IngestHarness.start()
        defer { Task { await ingest.stop() } }
        let a = ingest.apps.apps[0], b = ingest.apps.apps[1]
        let token = deviceToken()
        let aID = try await subscribe(ingest, a, token, "news")
        let aState = try await storedState(ingest.redis, app: a.id)
        let aPath = "/v1/apps/\(a.id)/subscriptions", bPath = "/v1/apps/\(b.id)/subscriptions"

        // B's keys on A's path: refused, whatever the method.
        for key in [b.publicKey, b.secretKey] {
            #expect(try await ingest.request("GET", aPath + "?deviceToken=\(token)", key: key).status == 403)
            #expect(try await ingest.request("POST", aPath, key: key, json: body([
                "channel": "news", "deviceToken": token, "tokenType": "alert", "metadata": ["by": "b"]])).status == 403)
            #expect(try await ingest.request("DELETE", aPath, key: key, json: body(["deviceToken": token])).status == 403)
        }
        // On its own path B sees none of A's, removes none of A's, and a rotation away from A's token stays in B.
        let listed = try await ingest.request("GET", bPath + "?deviceToken=\(token)", key: b.publicKey)
        #expect((try listed.json()["subscriptions"] as? [Any])?.isEmpty == true)
        let removed = try await ingest.request("DELETE", bPath, key: b.publicKey, json: body(["deviceToken": token]))
        #expect(try removed.json()["removed"] as? Int == 0)
        let rotated = try await ingest.request("POST", bPath, key: b.publicKey, json: body([
            "channel": "news", "deviceToken": deviceToken(), "tokenType": "alert", "previousToken": token]))
        #expect(rotated.status == 201)
        let own = try await ingest.request("POST", bPath, key: b.publicKey, json: body([
            "channel": "news", "deviceToken": token, "tokenType": "alert"]))
        #expect(own.status == 201, "B's subscription is its own, not an update of A's")
        #expect(try own.json()["id"] as? String != nil)

        #expect(try await storedState(ingest.redis, app: a.id) == aState)
        #expect(try await list(ingest, a, token).map(\.id) == [aID])
    }

    // MARK: Redis unavailable

    @Test func redisRefusingConnectionsGives503() async throws {
        let port = try closedPort()
        let ingest = try await IngestHarness.start(redisURL: "redis://127.0.0.1:\(port)/0")
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let started = ContinuousClock.now
        let response = try await ingest.request("POST", "/v1/apps/\(app.id)/subscriptions", key: app.publicKey,
                                                json: body(["channel": "news", "deviceToken": deviceToken(), "tokenType": "alert"]))
        #expect(response.status == 503, "\(response.text)")
        #expect(response.errorCode == "unavailable")
        // Alone this takes ~10 ms; the bound leaves room for the other tests loading the 2 cores meanwhile.
        let elapsed = ContinuousClock.now - started
        #expect(elapsed < .seconds(5), "answered after \(elapsed)")
        #expect(try await ingest.request("GET", "/healthz").status == 200)
        #expect(try await ingest.request("GET", "/readyz").status == 503)
    }

    @Test func redisThatNeverAnswersGives503WithinTheCommandTimeout() async throws {
        let silent = try SilentListener()
        let ingest = try await IngestHarness.start(redisURL: "redis://127.0.0.1:\(silent.port)/0")
        defer { Task { await ingest.stop() } }
        let app = ingest.apps.apps[0]
        let port = ingest.port, key = app.publicKey, path = "/v1/apps/\(app.id)/subscriptions?deviceToken=\(deviceToken())"
        let started = ContinuousClock.now
        // The client waits far longer than the server should, so a late answer is measured rather than cut off.
        let response = try await onThread {
            try RawHTTPClient(port: port, timeout: 30).request("GET", path, headers: ["X-API-Key": key])
        }
        let elapsed = ContinuousClock.now - started
        #expect(response.status == 503, "\(response.text)")
        #expect(response.errorCode == "unavailable")
        // The Redis client's deadline is 2 s per call (~2.1 s alone); the upper bound leaves room for the other
        // tests and builds loading the 2 cores, and still tells a bounded wait from a hang.
        #expect(elapsed >= .seconds(1.5) && elapsed < .seconds(10), "answered after \(elapsed)")
        withExtendedLifetime(silent) {}
    }

    // MARK: Helpers

    struct Listed { var id: String }

    @discardableResult
    func subscribe(_ ingest: IngestHarness, _ app: TestApps.Entry, _ token: String, _ channel: String,
                   type: String = "alert", activityID: String? = nil) async throws -> String {
        var fields: [String: Any] = ["channel": channel, "deviceToken": token, "tokenType": type]
        if let activityID { fields["activityID"] = activityID }
        let response = try await ingest.request("POST", "/v1/apps/\(app.id)/subscriptions", key: app.publicKey,
                                                json: body(fields))
        try #require(response.status == 201, "\(response.text)")
        return try #require(try response.json()["id"] as? String)
    }

    func list(_ ingest: IngestHarness, _ app: TestApps.Entry, _ token: String) async throws -> [Listed] {
        let response = try await ingest.request("GET", "/v1/apps/\(app.id)/subscriptions?deviceToken=\(token)",
                                                key: app.publicKey)
        try #require(response.status == 200, "\(response.text)")
        let subscriptions = try #require(try response.json()["subscriptions"] as? [[String: Any]])
        return subscriptions.compactMap { ($0["id"] as? String).map(Listed.init) }.sorted { $0.id < $1.id }
    }
}

/// JSON text of a body built from Swift values.
private func body(_ fields: [String: Any]) -> String {
    String(decoding: try! JSONSerialization.data(withJSONObject: fields, options: [.sortedKeys]), as: UTF8.self)
}

/// The Redis keys of an app's subscriptions (mirrors HeraldStore's layout, which the tests pin down).
private struct StoredKeys {
    let app: String
    func subscription(_ id: String, token: String) -> String { "herald:{\(app):d:\(token)}:sub:\(id)" }
    func channel(_ name: String) -> String { "herald:{\(app):c:\(name)}:ch" }
    func device(_ token: String) -> String { "herald:{\(app):d:\(token)}:dev" }

    /// The app's subscription records, on every master.
    func subscriptionKeys(_ redis: RedisClient) async throws -> [String] {
        try await keys(redis, matching: "herald:{\(app):d:*}:sub:*")
    }

    /// Keys matching `pattern` on every master, sorted.
    func keys(_ redis: RedisClient, matching pattern: String) async throws -> [String] {
        var keys: [String] = []
        for master in try await redis.masters() { keys += try await master.command(["KEYS", pattern]).strings ?? [] }
        return keys.sorted()
    }
}

/// A channel index: subscription id → stored push target.
/// A channel index's entries, each without its expiry (`~<seconds>~` after the two letters), which must be there
/// and in the future: every subscription made through the API expires unless renewed.
private func targets(_ redis: RedisClient, _ key: String) async throws -> [String: String] {
    let now = Int64(Date().timeIntervalSince1970)
    return try #require(try await redis.command(["HGETALL", key]).fieldValues).mapValues { value in
        let parts = value.split(separator: "~", maxSplits: 2, omittingEmptySubsequences: false)
        #expect(parts.count == 3 && (Int64(parts[1]) ?? 0) > now, "\(value) has no expiry")
        return parts.count == 3 ? String(parts[0] + parts[2]) : value
    }
}

/// A set's members, sorted.
private func members(_ redis: RedisClient, _ key: String) async throws -> [String] {
    (try await redis.command(["SMEMBERS", key]).strings ?? []).sorted()
}

/// Every key under the app's prefix with its content, so a test can assert that a refused request wrote nothing.
/// Rate-limit counters (`…:rl:…`) are left out: every admitted request counts, refused ones included.
private func storedState(_ redis: RedisClient, app: String) async throws -> [String: String] {
    var state: [String: String] = [:]
    let keys = try await StoredKeys(app: app).keys(redis, matching: "herald:{\(app)[:}]*")
    for key in keys where !key.contains(":rl:") {
        let type = try await redis.command(["TYPE", key]).string ?? "none"
        switch type {
        case "hash":
            let fields = try await redis.command(["HGETALL", key]).fieldValues ?? [:]
            state[key] = fields.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: "\n")
        case "set":
            state[key] = try await members(redis, key).joined(separator: "\n")
        default:
            state[key] = type
        }
    }
    return state
}

/// A port nothing listens on (bound, then closed again).
private func closedPort() throws -> UInt16 {
    let listener = try SilentListener()
    return listener.port
}

/// A TCP listener that never accepts: connections complete in the kernel's backlog, and what is sent is never
/// answered — a Redis that hangs.
private final class SilentListener {
    let fd: Int32
    let port: UInt16

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(fd, 64) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw SocketFailure(description: "listen: \(reason)")
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = getsockname(fd, $0, &length) }
        }
        self.fd = fd
        port = UInt16(bigEndian: address.sin_port)
    }

    deinit { close(fd) }
}

private struct SocketFailure: Error, CustomStringConvertible {
    let description: String
}
