import Foundation
import HeraldCore
import HeraldCrypto
import HeraldRedis
import HeraldRuntime
@testable import HeraldStore
import HeraldTestSupport
import Testing

/// A client for the Redis `scripts/test` started, and a fresh app id so tests never see each other's keys.
struct TestRedis {
    let client: RedisClient
    let app = "test-" + SecureRandom.hex(6)

    init() throws {
        client = RedisClient(configuration: try RedisConfiguration(url: try TestEnvironment.redisURL()))
    }

    /// Every key of the test's app (`herald:{<app>}:…` and `herald:{<app>:…}…`), on every master, but the markers
    /// of cluster removals (`RedisKeys.channelRemovals`), which expire by themselves: checked to.
    func appKeys() async throws -> [String] {
        var keys: [String] = []
        for master in try await client.masters() {
            for key in try await master.command(["KEYS", "herald:{" + app + "[:}]*"]).strings ?? [] {
                guard key.contains("}:gone:") else { keys.append(key); continue }
                let ttl = try await client.command(["TTL", key]).int ?? -1
                #expect(ttl > 0 && ttl <= 3 * RedisKeys.removalSpan, "\(key) expires")
            }
        }
        return keys.sorted()
    }

    /// Entries of the app's subscription expiry index, over all its buckets.
    func expiryEntries() async throws -> Int {
        let keys = RedisKeys(app: app)
        var total = 0
        for bucket in 0..<RedisKeys.expiryBuckets {
            total += Int(try await client.command(["ZCARD", keys.subscriptionExpiry(bucket: bucket)]).int ?? 0)
        }
        return total
    }
}

func json(_ text: String) -> JSONValue { try! JSONDecoder().decode(JSONValue.self, from: Data(text.utf8)) }
func token() -> String { SecureRandom.hex(32) }

func subscription(_ channel: String, _ token: String, _ type: String = "alert", extra: String = "") throws -> SubscriptionInput {
    let activity = type == "liveactivity-update" ? #", "activityID": "act-1""# : ""
    return try SubscriptionInput(json(#"{"channel": "\#(channel)", "deviceToken": "\#(token)", "tokenType": "\#(type)"\#(activity)\#(extra)}"#))
}

/// Without expiry (`ttl: nil`), so stored targets compare equal to ones built without `expiresAt`.
@Suite struct SubscriptionStoreTests {
    @Test func upsertCreatesThenUpdatesWithoutDuplicates() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, ttl: nil)
        let device = token()
        let first = try await store.upsert(app: redis.app, try subscription("order:42:status", device, extra: #", "metadata": {"a": 1}"#),
                                           now: Date(timeIntervalSince1970: 1_000))
        #expect(first.created && first.subscription.id.count == 24)
        let second = try await store.upsert(app: redis.app, try subscription("order:42:status", device),
                                            now: Date(timeIntervalSince1970: 2_000))
        #expect(!second.created && second.subscription.id == first.subscription.id)
        let listed = try await store.list(app: redis.app, deviceToken: device).subscriptions
        #expect(listed.count == 1)
        #expect(listed.first?.createdAt == first.subscription.createdAt)
        #expect(listed.first?.updatedAt == second.subscription.updatedAt && listed.first?.metadata == nil)
    }

    /// Ids are the first 24 hex digits of the SHA-256 of their parts joined by newlines (README, key layout):
    /// stored ids must not change when the way they are computed does.
    @Test func idsAreTheDocumentedDigestPrefixes() async throws {
        let redis = try TestRedis()
        let device = token()
        let stored = try await SubscriptionStore(redis: redis.client, ttl: nil)
            .upsert(app: redis.app, try subscription("order:é:status", device, "liveactivity-start"))
        #expect(stored.subscription.id == String(SHA256.hex(device + "\nliveactivity-start\norder:é:status").prefix(24)))
        let app = try ActivityStoreTests.app(), push = token()
        let registered = try await ActivityStore(redis: redis.client).register(
            app: redis.app, user: "u", try ActivityStoreTests.input(app, post: "0123abcd", token: push))
        #expect(registered.registration.id == String(SHA256.hex("\(redis.app)\nu\n0123abcd\n\(push)").prefix(24)))
    }

    @Test func rotationRemovesOnlySameTypeSubscriptionsOfTheOldToken() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, ttl: nil)
        let old = token(), new = token()
        _ = try await store.upsert(app: redis.app, try subscription("a", old, "liveactivity-start"))
        _ = try await store.upsert(app: redis.app, try subscription("b", old, "liveactivity-start"))
        _ = try await store.upsert(app: redis.app, try subscription("a", old, "alert"))
        _ = try await store.upsert(app: redis.app, try subscription("a", new, "liveactivity-start",
                                                                    extra: #", "previousToken": "\#(old)""#))
        let remaining = try await store.list(app: redis.app, deviceToken: old).subscriptions
        #expect(remaining.map(\.tokenType) == [.alert])
        let (_, channelA, _) = try await store.channelBatch(app: redis.app, channel: "a", cursor: "0")
        #expect(Set(channelA.map(\.deviceToken)) == [old, new])
        let (_, channelB, _) = try await store.channelBatch(app: redis.app, channel: "b", cursor: "0")
        #expect(channelB.isEmpty)
    }

    @Test func channelBatchReadsWhatAPushNeeds() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, ttl: nil)
        let alert = token(), update = token()
        _ = try await store.upsert(app: redis.app, try subscription("c", alert, extra: #", "environment": "sandbox""#))
        _ = try await store.upsert(app: redis.app, try subscription("c", update, "liveactivity-update"))
        let (cursor, targets, _) = try await store.channelBatch(app: redis.app, channel: "c", cursor: "0")
        #expect(cursor == "0")
        #expect(Set(targets.map(\.deviceToken)) == [alert, update])
        #expect(targets.first { $0.deviceToken == alert } == ChannelTarget(deviceToken: alert, tokenType: .alert,
                                                                            environment: .sandbox, activityID: nil))
        #expect(targets.first { $0.deviceToken == update } == ChannelTarget(
            deviceToken: update, tokenType: .liveActivityUpdate, environment: .production, activityID: "act-1"))
    }

    @Test func channelBatchSkipsEntriesNotWrittenByTheScripts() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, ttl: nil)
        let kept = token()
        _ = try await store.upsert(app: redis.app, try subscription("odd", kept))
        let index = RedisKeys(app: redis.app).channel("odd")
        _ = try await redis.client.command(["HSET", index, "x1", "", "x2", "zz" + token(), "x3", "ap"])
        let (cursor, targets, _) = try await store.channelBatch(app: redis.app, channel: "odd", cursor: "0")
        #expect(cursor == "0")
        #expect(targets == [ChannelTarget(deviceToken: kept, tokenType: .alert, environment: .production, activityID: nil)])
    }

    @Test func removesOneOrAllAndCounts() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, ttl: nil)
        let device = token()
        for channel in ["a", "b", "c"] { _ = try await store.upsert(app: redis.app, try subscription(channel, device)) }
        let one = try SubscriptionRemoval(json(#"{"deviceToken": "\#(device)", "channel": "a", "tokenType": "alert"}"#))
        #expect(try await store.remove(app: redis.app, one) == 1)
        #expect(try await store.remove(app: redis.app, one) == 0)
        #expect(try await store.remove(app: redis.app, try SubscriptionRemoval(json(#"{"deviceToken": "\#(device)"}"#))) == 2)
        #expect(try await store.list(app: redis.app, deviceToken: device).subscriptions.isEmpty)
    }

    /// A record Redis answers with an error (WRONGTYPE: the key holds a string) is not taken for a missing one:
    /// removing the token fails, as the dispatcher's data refusals do, and the device index keeps its entry.
    @Test func aRecordRedisCannotReadStopsARemovalInsteadOfDroppingItsIndexEntry() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, ttl: nil)
        let device = token()
        let created = try await store.upsert(app: redis.app, try subscription("a", device)).subscription
        let keys = RedisKeys(app: redis.app)
        let record = keys.subscription(created.id, token: device)
        try await redis.client.command(["DEL", record])
        try await redis.client.command(["SET", record, "not a hash"])
        await #expect(throws: RedisError.self) { try await store.removeInvalidToken(app: redis.app, deviceToken: device) }
        #expect(try await redis.client.command(["SISMEMBER", keys.device(device), created.id]).int == 1)
        for key in [record, keys.device(device), keys.channel("a")] { try await redis.client.command(["DEL", key]) }
    }

    @Test func invalidTokenRemovalKeepsSubscriptionsRenewedAfterTheTimestamp() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, ttl: nil)
        let device = token()
        _ = try await store.upsert(app: redis.app, try subscription("old", device), now: Date(timeIntervalSince1970: 1_000))
        _ = try await store.upsert(app: redis.app, try subscription("new", device), now: Date(timeIntervalSince1970: 3_000))
        let removed = try await store.removeInvalidToken(app: redis.app, deviceToken: device,
                                                         keepUpdatedAfter: Date(timeIntervalSince1970: 2_000))
        #expect(removed == 1)
        #expect(try await store.list(app: redis.app, deviceToken: device).subscriptions.map(\.channel) == ["new"])
        let keys = RedisKeys(app: redis.app)
        #expect(try await redis.client.command(["EXISTS", keys.channel("old")]).int == 0)
        #expect(try await redis.client.command(["HLEN", keys.channel("new")]).int == 1)
    }

    /// A channel larger than one HSCAN batch returns exactly its live subscriptions' targets, each once, after
    /// creates, updates (environment, activityID), rotations and removals, whatever the activityID holds.
    @Test func channelBatchesReturnExactlyTheLiveTargets() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, ttl: nil)
        let odd = "a:b c é/\\\"🙂:"
        var expected: [String: ChannelTarget] = [:] // by token
        func add(_ device: String, _ type: String, activity: String? = nil, sandbox: Bool = false) async throws {
            var input = try subscription("big", device, type, extra: sandbox ? #", "environment": "sandbox""# : "")
            if let activity { input.activityID = activity }
            _ = try await store.upsert(app: redis.app, input)
            expected[device] = ChannelTarget(deviceToken: device, tokenType: input.tokenType,
                                             environment: input.environment, activityID: input.activityID)
        }
        var devices: [String] = []
        for index in 0..<1_200 {
            let device = token()
            devices.append(device)
            switch index % 4 {
            case 0: try await add(device, "alert")
            case 1: try await add(device, "alert", sandbox: true)
            case 2: try await add(device, "liveactivity-start")
            default: try await add(device, "liveactivity-update", activity: index % 8 == 3 ? odd : "act-\(index)")
            }
        }
        for device in devices[0..<50] {
            #expect(try await store.removeInvalidToken(app: redis.app, deviceToken: device) == 1)
            expected[device] = nil
        }
        for device in devices[50..<100] {
            let one = try SubscriptionRemoval(json(#"{"deviceToken": "\#(device)", "channel": "big", "tokenType": "\#(expected[device]!.tokenType.rawValue)"}"#))
            #expect(try await store.remove(app: redis.app, one) == 1)
            expected[device] = nil
        }
        for (offset, device) in devices[100..<200].enumerated() where expected[device]?.tokenType == .liveActivityUpdate {
            try await add(device, "liveactivity-update", activity: offset % 2 == 0 ? odd : "moved", sandbox: true)
        }
        for device in devices[200..<250] where expected[device]?.tokenType == .alert {
            let rotated = token()
            _ = try await store.upsert(app: redis.app, try subscription("big", rotated, extra: #", "previousToken": "\#(device)""#))
            expected[rotated] = ChannelTarget(deviceToken: rotated, tokenType: .alert, environment: .production,
                                              activityID: nil)
            expected[device] = nil
        }
        #expect(expected.values.contains { $0.activityID == odd })
        var seen: [ChannelTarget] = [], cursor = "0", batches = 0
        repeat {
            let batch = try await store.channelBatch(app: redis.app, channel: "big", cursor: cursor, count: 500)
            seen += batch.targets
            cursor = batch.cursor
            batches += 1
        } while cursor != "0"
        #expect(batches > 1)
        #expect(seen.count == expected.count)
        #expect(Dictionary(seen.map { ($0.deviceToken, $0) }, uniquingKeysWith: { first, _ in first }) == expected)
    }
}

@Suite struct ActivityStoreTests {
    static func input(_ app: App, post: String, token: String) throws -> ActivityRegistrationInput {
        try ActivityRegistrationInput(json(#"{"push_token": "\#(token)", "post_id_hash": "\#(post)", "bundle_id": "\#(app.apns.bundleId)"}"#), app: app)
    }

    func input(_ app: App, post: String, token: String) throws -> ActivityRegistrationInput {
        try Self.input(app, post: post, token: token)
    }

    static func app() throws -> App {
        let key = try PrivateKey.generateP256().pem
        let file = #"{"apps": [{"id": "a", "keys": [], "apns": {"teamId": "TEAM123456", "keyId": "KEY1234567", "privateKeyPath": "k", "bundleId": "com.example.app"}}]}"#
        return try AppDirectory.parse(Data(file.utf8)) { _ in key }.apps["a"]!
    }

    @Test func reRegistrationKeepsIdentityAndRenewsTheTTL() async throws {
        let redis = try TestRedis()
        let store = ActivityStore(redis: redis.client, ttl: .seconds(3600))
        let app = try Self.app(), push = token()
        let first = try await store.register(app: redis.app, user: "u", try input(app, post: "0123abcd", token: push),
                                             now: Date(timeIntervalSinceNow: -10))
        #expect(!first.renewed && first.registration.id.count == 24)
        _ = try await redis.client.command(["PEXPIRE", RedisKeys(app: redis.app).registration(first.registration.id, post: "0123abcd"), "5000"])
        let second = try await store.register(app: redis.app, user: "u", try input(app, post: "0123abcd", token: push))
        #expect(second.renewed && second.registration.id == first.registration.id)
        #expect(second.registration.createdAt == first.registration.createdAt)
        #expect(second.registration.lastSeenAt != first.registration.lastSeenAt)
        let ttl = try await redis.client.command(["TTL", RedisKeys(app: redis.app).registration(first.registration.id, post: "0123abcd")]).int ?? 0
        #expect(ttl > 3500)
        let other = try await store.register(app: redis.app, user: "v", try input(app, post: "0123abcd", token: push))
        #expect(!other.renewed && other.registration.id != first.registration.id)
    }

    /// The hash stores no `id` (the key's suffix) and no `lastSeenAt` (formatted from `lastSeenMs`); readers give
    /// back what `register` returned, and still read hashes written with both fields.
    @Test func registrationsReadBackFromTheFieldsStored() async throws {
        let redis = try TestRedis()
        let store = ActivityStore(redis: redis.client, ttl: .seconds(3600))
        let app = try Self.app(), push = token(), keys = RedisKeys(app: redis.app)
        let stored = try await store.register(app: redis.app, user: "u", try input(app, post: "0badcafe", token: push),
                                              now: Date(timeIntervalSince1970: 1_764_460_800.123))
        #expect(stored.registration.createdAt == "2025-11-30T00:00:00.123Z" && stored.registration.lastSeenAt == stored.registration.createdAt)
        let fields = try #require(try await redis.client.command(["HGETALL", keys.registration(stored.registration.id, post: "0badcafe")]).fieldValues)
        #expect(Set(fields.keys) == ["createdAt", "user", "postIdHash", "pushToken", "environment", "bundleId", "lastSeenMs"])
        #expect(fields["lastSeenMs"] == "1764460800123")
        #expect(try await store.registrations(app: redis.app, postIDHash: "0badcafe", ids: [stored.registration.id]) == [stored.registration])

        // A hash written by the earlier script (with `id` and `lastSeenAt`) reads the same way.
        let old = "0123456789abcdef01234567"
        _ = try await redis.client.command(["HSET", keys.registration(old, post: "0badcafe"), "createdAt", "2025-11-30T00:00:00.000Z",
            "id", old, "user", "w", "postIdHash", "0badcafe", "pushToken", push, "environment", "sandbox",
            "bundleId", "com.example.app", "lastSeenAt", "2025-11-30T00:00:01.000Z", "lastSeenMs", "1764460801000"])
        let read = try await store.registrations(app: redis.app, postIDHash: "0badcafe", ids: [old, "ffffffffffffffffffffffff"])
        #expect(read.map(\.id) == [old] && read.map(\.user) == ["w"] && read.map(\.environment) == [.sandbox])
        #expect(read.map(\.createdAt) == ["2025-11-30T00:00:00.000Z"] && read.map(\.lastSeenAt) == ["2025-11-30T00:00:01.000Z"])
        // What a fan-out reads of them: token, environment and bundle id only.
        #expect(try await store.pushTargets(app: redis.app, postIDHash: "0badcafe", ids: [stored.registration.id, old, "ffffffffffffffffffffffff"]) == [
            ActivityPushTarget(pushToken: push, environment: stored.registration.environment, bundleID: stored.registration.bundleID),
            ActivityPushTarget(pushToken: push, environment: .sandbox, bundleID: "com.example.app"),
        ])
    }

    @Test func expiredRegistrationsLeaveThePostOnTheirOwn() async throws {
        let redis = try TestRedis()
        let store = ActivityStore(redis: redis.client, ttl: .seconds(3))
        let app = try Self.app()
        for _ in 0..<3 { _ = try await store.register(app: redis.app, user: "u", try input(app, post: "feedbeef", token: token())) }
        #expect(try await store.postBatch(app: redis.app, postIDHash: "feedbeef", cursor: "0").registrations.count == 3)
        try await Task.sleep(for: .milliseconds(3300))
        #expect(try await store.postBatch(app: redis.app, postIDHash: "feedbeef", cursor: "0").registrations.isEmpty)
        #expect(try await redis.client.command(["EXISTS", RedisKeys(app: redis.app).post("feedbeef")]).int == 0)
    }

    /// The registration script gives a new (or TTL-less) index `ttl` plus a sixtieth, renews an index's TTL only
    /// once it has fallen below `ttl` and prunes its expired members then, and never shortens it.
    @Test func indexesArePrunedAndKeepATTLNoShorterThanTheirNewestMember() async throws {
        let redis = try TestRedis()
        let store = ActivityStore(redis: redis.client, ttl: .seconds(3600))
        let app = try Self.app(), keys = RedisKeys(app: redis.app)
        let (ttl, slack) = (3_600_000, 60_000)
        func pttl(_ key: String) async throws -> Int { Int(try await redis.client.command(["PTTL", key]).int ?? -3) }

        let first = token()
        _ = try await store.register(app: redis.app, user: "u", try input(app, post: "abcdef01", token: first))
        for index in [keys.post("abcdef01"), keys.activityToken(first)] {
            let left = try await pttl(index)
            #expect(left > ttl && left <= ttl + slack, "\(index): a new index gets ttl + ttl/60, got \(left)")
        }

        // A TTL above `ttl` is left alone (never shortened), and so is an expired member until the TTL is renewed.
        let nowMs = Int64(Date().timeIntervalSince1970 * 1000)
        _ = try await redis.client.command(["ZADD", keys.post("abcdef01"), String(nowMs - 1), "gone"])
        _ = try await redis.client.command(["PEXPIRE", keys.post("abcdef01"), String(3 * ttl)])
        _ = try await store.register(app: redis.app, user: "u", try input(app, post: "abcdef01", token: token()))
        #expect(try await redis.client.command(["ZCARD", keys.post("abcdef01")]).int == 3)
        #expect(try await pttl(keys.post("abcdef01")) > 2 * ttl)
        #expect(try await store.postBatch(app: redis.app, postIDHash: "abcdef01", cursor: "0").registrations.count == 2)

        // Below `ttl` (or without a TTL at all) it is raised again to ttl + ttl/60, and its expired members go.
        _ = try await redis.client.command(["ZADD", keys.post("abcdef01"), String(nowMs - 1), "gone"])
        _ = try await redis.client.command(["ZADD", keys.activityToken(first), String(nowMs - 1), "gone"])
        _ = try await redis.client.command(["PEXPIRE", keys.post("abcdef01"), "1000"])
        _ = try await redis.client.command(["PERSIST", keys.activityToken(first)])
        let renewed = try await store.register(app: redis.app, user: "u", try input(app, post: "abcdef01", token: first))
        #expect(renewed.renewed)
        #expect(try await redis.client.command(["ZCARD", keys.post("abcdef01")]).int == 2)
        #expect(try await redis.client.command(["ZCARD", keys.activityToken(first)]).int == 1)
        for index in [keys.post("abcdef01"), keys.activityToken(first)] {
            let left = try await pttl(index)
            #expect(left > ttl && left <= ttl + slack, "\(index): renewed to ttl + ttl/60, got \(left)")
        }

        // A new registration whose token index exists (the token on another post) renews and prunes it alike.
        _ = try await redis.client.command(["ZADD", keys.activityToken(first), String(nowMs - 1), "gone"])
        _ = try await redis.client.command(["PEXPIRE", keys.activityToken(first), "1000"])
        let other = try await store.register(app: redis.app, user: "u", try input(app, post: "abcdef02", token: first))
        #expect(!other.renewed)
        #expect(try await redis.client.command(["ZCARD", keys.activityToken(first)]).int == 2)
        let left = try await pttl(keys.activityToken(first))
        #expect(left > ttl && left <= ttl + slack, "a known token index is renewed to ttl + ttl/60, got \(left)")
    }

    /// A registration whose `lastSeenMs` is not a number (written by hand) goes on a 410 like any older one, rather
    /// than fail the removal every time.
    @Test func aRegistrationWithAnUnreadableLastSeenIsRemoved() async throws {
        let redis = try TestRedis()
        let store = ActivityStore(redis: redis.client)
        let app = try Self.app(), dead = token()
        let stored = try await store.register(app: redis.app, user: "u", try input(app, post: "0dd5eeee", token: dead))
        let key = RedisKeys(app: redis.app).registration(stored.registration.id, post: "0dd5eeee")
        _ = try await redis.client.command(["HSET", key, "lastSeenMs", "yesterday"])
        #expect(try await store.removeInvalidToken(app: redis.app, pushToken: dead, keepSeenAfter: Date()) == 1)
        #expect(try await redis.client.command(["EXISTS", key]).int == 0)
    }

    /// On a cluster a registration writes its token index entry, then the registration and its post entry: a 410
    /// between the two finds the entry without its registration, and must leave it (unless expired), so that the
    /// registration written next can still be removed by a 410.
    @Test func aTokenEntryWhoseRegistrationIsNotWrittenYetStays() async throws {
        let redis = try TestRedis()
        let store = ActivityStore(redis: redis.client)
        let app = try Self.app(), dead = token(), keys = RedisKeys(app: redis.app)
        let stored = try await store.register(app: redis.app, user: "u", try input(app, post: "0a1b2c3d", token: dead))
        let registration = keys.registration(stored.registration.id, post: "0a1b2c3d")
        // As between the two steps: the token's entry only.
        _ = try await redis.client.command(["DEL", registration])
        _ = try await redis.client.command(["ZREM", keys.post("0a1b2c3d"), stored.registration.id])
        let expired = "0123456789abcdef01234567" + "0e0e0e0e"
        _ = try await redis.client.command(["ZADD", keys.activityToken(dead), "1000", expired])
        #expect(try await store.removeInvalidToken(app: redis.app, pushToken: dead) == 0)
        #expect(try await redis.client.command(["ZSCORE", keys.activityToken(dead), stored.registration.id + "0a1b2c3d"]).string != nil,
                "the entry of a registration not written yet was taken")
        #expect(try await redis.client.command(["ZSCORE", keys.activityToken(dead), expired]).string == nil, "an expired entry was kept")
        // The second step lands: the next 410 removes it, entry and all.
        _ = try await store.register(app: redis.app, user: "u", try input(app, post: "0a1b2c3d", token: dead))
        #expect(try await store.removeInvalidToken(app: redis.app, pushToken: dead) == 1)
        #expect(try await redis.client.command(["EXISTS", keys.activityToken(dead)]).int == 0)
        #expect(try await store.postBatch(app: redis.app, postIDHash: "0a1b2c3d", cursor: "0").registrations.isEmpty)
    }

    @Test func finalUpdateAndInvalidTokenRemoval() async throws {
        let redis = try TestRedis()
        let store = ActivityStore(redis: redis.client)
        let app = try Self.app(), kept = token(), dead = token()
        _ = try await store.register(app: redis.app, user: "u", try input(app, post: "aaaabbbb", token: kept))
        _ = try await store.register(app: redis.app, user: "u", try input(app, post: "aaaabbbb", token: dead))
        _ = try await store.register(app: redis.app, user: "u", try input(app, post: "ccccdddd", token: dead))
        #expect(try await store.removeInvalidToken(app: redis.app, pushToken: dead) == 2)
        #expect(try await redis.client.command(["EXISTS", RedisKeys(app: redis.app).activityToken(dead)]).int == 0,
                "the token's index entries went with its registrations")
        let left = try await store.postBatch(app: redis.app, postIDHash: "aaaabbbb", cursor: "0").registrations
        #expect(left.map(\.pushToken) == [kept])
        #expect(try await store.removePost(app: redis.app, postIDHash: "aaaabbbb") == 1)
        #expect(try await store.postBatch(app: redis.app, postIDHash: "aaaabbbb", cursor: "0").registrations.isEmpty)
    }

    @Test func aPostsRegistrationsAreRemovedInBatchesWithTheirTokenIndexEntries() async throws {
        let redis = try TestRedis()
        let store = ActivityStore(redis: redis.client)
        let app = try Self.app()
        for _ in 0..<25 { _ = try await store.register(app: redis.app, user: "u", try input(app, post: "eeeeffff", token: token())) }
        #expect(try await store.removePost(app: redis.app, postIDHash: "eeeeffff", batchSize: 10) == 25)
        #expect(try await redis.appKeys() == [], "registrations, the post index and the token indexes all gone")
        #expect(try await store.removePost(app: redis.app, postIDHash: "eeeeffff", batchSize: 10) == 0)
    }

    /// A 410's clean-up takes a token index entry out only as it read it: a registration made again in between
    /// wrote a new score and keeps its entry.
    @Test func aTokenIndexEntryRescoredSinceItWasReadStays() async throws {
        let redis = try TestRedis()
        let index = RedisKeys(app: redis.app).activityToken(token())
        try await redis.client.command(["ZADD", index, "1000", "m"])
        let stale = try await redis.client.run(Scripts.removeUnchangedEntry, keys: [index], args: ["m", "999"])
        let kept = try await redis.client.command(["ZSCORE", index, "m"]).string
        #expect(stale.int == 0 && kept == "1000")
        let current = try await redis.client.run(Scripts.removeUnchangedEntry, keys: [index], args: ["m", "1000"])
        let left = try await redis.client.command(["EXISTS", index]).int
        #expect(current.int == 1 && left == 0)
    }
}

/// Bounded state per device and subscriptions that end.
@Suite struct SubscriptionLifetimeTests {
    @Test func aDevicePastItsCapIsRefusedWithNothingChangedButUpdatesStillWork() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, maxPerDevice: 3)
        let device = token()
        for n in 1...3 { _ = try await store.upsert(app: redis.app, try subscription("c\(n)", device)) }
        await #expect(throws: StoreError.self) { try await store.upsert(app: redis.app, try subscription("c4", device)) }
        #expect(try await redis.client.command(["EXISTS", RedisKeys(app: redis.app).channel("c4")]).int == 0)
        let update = try await store.upsert(app: redis.app, try subscription("c1", device, extra: #", "metadata": {"v": 2}"#))
        #expect(!update.created, "an update of an existing subscription is not a new one")
        #expect(try await store.list(app: redis.app, deviceToken: device).subscriptions.count == 3)
    }

    @Test func anExpiredSubscriptionReceivesNothingAndTheSweepRemovesItEverywhere() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, ttl: .seconds(100))
        let keys = RedisKeys(app: redis.app)
        let (old, renewed) = (token(), token())
        let start = Date()
        _ = try await store.upsert(app: redis.app, try subscription("news", old), now: start)
        _ = try await store.upsert(app: redis.app, try subscription("news", renewed), now: start)
        // Renewed (re-subscribed) 90 s later: it lives 100 s from then.
        _ = try await store.upsert(app: redis.app, try subscription("news", renewed), now: start.addingTimeInterval(90))
        let later = start.addingTimeInterval(150)
        let batch = try await store.channelBatch(app: redis.app, channel: "news", cursor: "0", now: later)
        #expect(batch.targets.map(\.deviceToken) == [renewed], "the expired one is skipped before the sweep")
        #expect(try await store.list(app: redis.app, deviceToken: old, now: later).subscriptions.isEmpty)
        #expect(try await store.expire(app: redis.app, now: later) == 1)
        #expect(try await redis.client.command(["HLEN", keys.channel("news")]).int == 1)
        #expect(try await redis.client.command(["EXISTS", keys.device(old)]).int == 0)
        #expect(try await redis.expiryEntries() == 1)
        #expect(try await store.expire(app: redis.app, now: later) == 0)
        #expect(try await store.expire(app: redis.app, now: start.addingTimeInterval(200)) == 1)
        #expect(try await redis.appKeys() == [], "nothing left anywhere")
    }

    /// Subscription records Redis cannot read (keys of another type), more than a batch of them ahead of a due one
    /// in its expiry index: the sweep passes over them, removes the rest, and says what it left.
    @Test func recordsRedisCannotReadDoNotStopTheSweep() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, ttl: .seconds(100), batchSize: 4)
        let keys = RedisKeys(app: redis.app)
        let device = token()
        let due = try await store.upsert(app: redis.app, try subscription("news", device),
                                         now: Date(timeIntervalSinceNow: -3600)).subscription
        let index = keys.subscriptionExpiry(id: due.id)
        var broken: [String] = []
        for _ in 0..<6 { // scored before the due one: read first
            let (id, other) = (SecureRandom.hex(12), token())
            broken.append(keys.subscription(id, token: other))
            _ = try await redis.client.command(["SET", broken[broken.count - 1], "not a hash"])
            _ = try await redis.client.command(["ZADD", index, "1", id + other])
        }
        let incomplete = await #expect(throws: SubscriptionStore.SweepIncomplete.self) {
            try await store.expire(app: redis.app)
        }
        #expect(incomplete?.removed == 1)
        #expect(incomplete?.description.contains("WRONGTYPE") == true, "\(String(describing: incomplete))")
        #expect(try await store.list(app: redis.app, deviceToken: device).subscriptions.isEmpty)
        #expect(try await redis.expiryEntries() == 6, "the unreadable ones' entries stay")
        for key in broken { _ = try await redis.client.command(["DEL", key]) }
        #expect(try await store.expire(app: redis.app) == 0)
        #expect(try await redis.expiryEntries() == 0, "the entries of records now gone are dropped")
    }

    @Test func theSweepKeepsASubscriptionWrittenSinceWithoutAnExpiry() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, ttl: nil)
        let device = token()
        let stored = try await store.upsert(app: redis.app, try subscription("news", device)).subscription
        // An expiry entry from when the TTL was on, which a crash kept the upsert from removing.
        _ = try await redis.client.command(["ZADD", RedisKeys(app: redis.app).subscriptionExpiry(id: stored.id), "1000",
                                            stored.id + device])
        #expect(try await store.expire(app: redis.app) == 0)
        #expect(try await store.list(app: redis.app, deviceToken: device).subscriptions.map(\.id) == [stored.id])
        #expect(try await redis.expiryEntries() == 0)
    }

    /// The sweep reads a subscription as expired, the device subscribes again, then the sweep removes what it
    /// read: the renewed subscription keeps its channel and expiry entries (it would otherwise get no pushes until
    /// its next write), while an expired one nobody renewed goes.
    @Test func aRenewalBetweenTheSweepsReadAndItsRemovalKeepsTheSubscription() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, ttl: .seconds(60))
        let keys = RedisKeys(app: redis.app)
        let hourAgo = Date(timeIntervalSinceNow: -3600)
        var read: [SubscriptionStore.Removal] = []
        let (renewing, lapsed) = (token(), token())
        for device in [renewing, lapsed] {
            let stored = try await store.upsert(app: redis.app, try subscription("news", device), now: hourAgo).subscription
            let updatedMs = try await redis.client.command(["HGET", keys.subscription(stored.id, token: device), "updatedMs"])
            read.append(.init(id: stored.id, token: device, channel: "news", updatedMs: try #require(updatedMs.string)))
        }
        _ = try await store.upsert(app: redis.app, try subscription("news", renewing))

        #expect(try await store.remove(keys, read, expiredBy: Int64(Date().timeIntervalSince1970)) == 1)
        let targets = try await store.channelBatch(app: redis.app, channel: "news", cursor: "0").targets
        #expect(targets.map(\.deviceToken) == [renewing])
        #expect(try await store.list(app: redis.app, deviceToken: renewing).subscriptions.count == 1)
        #expect(try await store.list(app: redis.app, deviceToken: lapsed).subscriptions.isEmpty)
        #expect(try await redis.expiryEntries() == 1)
        #expect(try await store.expire(app: redis.app) == 0, "the renewed one is not due yet")
    }

    /// An unsubscribe reads the subscription, the device subscribes again, then the unsubscribe removes what it
    /// read: the subscription written since stays, listed and reachable by pushes (its channel entry was taken in
    /// between on a cluster, and is put back).
    @Test func aResubscribeBetweenARemovalsReadAndItsRemovalKeepsTheSubscriptionReachable() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client)
        let keys = RedisKeys(app: redis.app)
        let device = token()
        let stored = try await store.upsert(app: redis.app, try subscription("news", device),
                                            now: Date(timeIntervalSinceNow: -10)).subscription
        let updatedMs = try await redis.client.command(["HGET", keys.subscription(stored.id, token: device), "updatedMs"])
        let read = SubscriptionStore.Removal(id: stored.id, token: device, channel: "news",
                                             updatedMs: try #require(updatedMs.string))
        _ = try await store.upsert(app: redis.app, try subscription("news", device))

        #expect(try await store.remove(keys, [read]) == 0)
        let targets = try await store.channelBatch(app: redis.app, channel: "news", cursor: "0").targets
        #expect(targets.map(\.deviceToken) == [device])
        #expect(try await store.list(app: redis.app, deviceToken: device).subscriptions.map(\.id) == [stored.id])
        #expect(try await redis.expiryEntries() == 1)
    }

    @Test(.enabled(if: onCluster, "on a standalone Redis an upsert writes its record and entries in one script"))
    func anUpsertsEntryArrivingAfterARemovalOfItsRecordIsNotWritten() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client)
        let keys = RedisKeys(app: redis.app)
        let device = token()
        let stored = try await store.upsert(app: redis.app, try subscription("news", device)).subscription
        let late = try await holdBackIndexStep(redis, id: stored.id, device: device)
        // An unsubscribe reads the record and removes it.
        #expect(try await unsubscribe(store, redis, device) == 1)
        // Then the upsert's last step arrives.
        try await store.index(keys, [late], onlyWhereMissing: false)
        #expect(try await redis.client.command(["HLEN", keys.channel("news")]).int == 0, "no entry without its record")
        #expect(try await store.list(app: redis.app, deviceToken: device).subscriptions.isEmpty)

        // A later subscribe of the same device and channel is indexed as usual: a version is the write's
        // millisecond, so it is a new one.
        try await Task.sleep(for: .milliseconds(2))
        _ = try await store.upsert(app: redis.app, try subscription("news", device))
        #expect(try await store.channelBatch(app: redis.app, channel: "news", cursor: "0").targets.map(\.deviceToken) == [device])
        #expect(try await store.remove(app: redis.app, SubscriptionRemoval(json(#"{"deviceToken": "\#(device)"}"#))) == 1)
        #expect(try await redis.appKeys() == [])
    }

    /// An upsert whose last step is held up (a reconnect to the channel's node) while the same subscription is
    /// written again and removed: its entry would be one with no record behind it.
    @Test(.enabled(if: onCluster, "on a standalone Redis an upsert writes its record and entries in one script"))
    func anOlderUpsertsEntryArrivingAfterANewerOneWasRemovedIsNotWritten() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client)
        let keys = RedisKeys(app: redis.app)
        let device = token(), first = Date()
        let stored = try await store.upsert(app: redis.app, try subscription("news", device), now: first).subscription
        let late = try await holdBackIndexStep(redis, id: stored.id, device: device)
        // The same subscribe again, through a pod whose clock is 5 ms behind: its version still comes after the
        // first's.
        _ = try await store.upsert(app: redis.app, try subscription("news", device), now: first - 0.005)
        let newer = try await redis.client.command(["HGET", keys.subscription(stored.id, token: device), "updatedMs"])
        #expect(newer.string == String((Int64(late.updatedMs) ?? 0) + 1), "a record's version only grows")
        #expect(try await unsubscribe(store, redis, device) == 1)
        // Then the first upsert's last step arrives.
        try await store.index(keys, [late], onlyWhereMissing: false)
        #expect(try await redis.client.command(["HLEN", keys.channel("news")]).int == 0, "no entry without its record")
        #expect(try await store.channelBatch(app: redis.app, channel: "news", cursor: "0").targets.isEmpty)
        _ = try await redis.client.command(["ZREM", keys.subscriptionExpiry(id: stored.id), stored.id + device])

        // Subscribed again through a pod whose clock is behind the version removed: a later version all the same,
        // which the removal's marker does not keep out of the index.
        _ = try await store.upsert(app: redis.app, try subscription("news", device), now: first - 0.010)
        let again = try await redis.client.command(["HGET", keys.subscription(stored.id, token: device), "updatedMs"])
        #expect(again.string == String((Int64(late.updatedMs) ?? 0) + 2), "past the removed version")
        #expect(try await store.channelBatch(app: redis.app, channel: "news", cursor: "0").targets.map(\.deviceToken) == [device])
        #expect(try await unsubscribe(store, redis, device) == 1)
        #expect(try await redis.appKeys() == [])
    }

    /// An upsert's last step not arrived yet: the channel and expiry index entries of subscription `id` to channel
    /// "news" taken out by hand, returned to be written late with `SubscriptionStore.index`.
    private func holdBackIndexStep(_ redis: TestRedis, id: String, device: String) async throws -> SubscriptionStore.Indexed {
        let keys = RedisKeys(app: redis.app)
        let record = try #require(try await redis.client.command(
            ["HMGET", keys.subscription(id, token: device), "updatedMs", "expiresAt"]).array?.map(\.string))
        let entry = try #require(try await redis.client.command(["HGET", keys.channel("news"), id]).string)
        _ = try await redis.client.command(["HDEL", keys.channel("news"), id])
        _ = try await redis.client.command(["ZREM", keys.subscriptionExpiry(id: id), id + device])
        return SubscriptionStore.Indexed(id: id, token: device, channel: "news", target: entry,
                                         updatedMs: try #require(record[0]), expiresAt: record[1].flatMap { Int64($0) })
    }

    /// DELETE of the device's alert subscription to "news".
    private func unsubscribe(_ store: SubscriptionStore, _ redis: TestRedis, _ device: String) async throws -> Int {
        try await store.remove(app: redis.app, SubscriptionRemoval(json(
            #"{"deviceToken": "\#(device)", "channel": "news", "tokenType": "alert"}"#)))
    }

    @Test func closingAChannelRemovesEverySubscriptionInBatches() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, batchSize: 7)
        let keys = RedisKeys(app: redis.app)
        let devices = (0..<40).map { _ in token() }
        for device in devices {
            _ = try await store.upsert(app: redis.app, try subscription("order:1:status", device))
            _ = try await store.upsert(app: redis.app, try subscription("news", device))
        }
        #expect(try await store.removeChannel(app: redis.app, channel: "order:1:status") == 40)
        #expect(try await redis.client.command(["EXISTS", keys.channel("order:1:status")]).int == 0)
        for device in devices.prefix(3) {
            #expect(try await store.list(app: redis.app, deviceToken: device).subscriptions.map(\.channel) == ["news"])
        }
        #expect(try await redis.expiryEntries() == 40)
        #expect(try await store.removeChannel(app: redis.app, channel: "order:1:status") == 0)
    }

    /// A request past its deadline has its handler cancelled: closing a channel then stops between batches
    /// rather than run on unseen, and calling again finishes it.
    @Test func closingAChannelStopsWhenCancelledAndFinishesWhenCalledAgain() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, batchSize: 5)
        let devices = (0..<60).map { _ in token() }
        for device in devices { _ = try await store.upsert(app: redis.app, try subscription("big", device)) }
        let closing = Task {
            withUnsafeCurrentTask { $0?.cancel() } // cancelled before it starts, whichever thread runs it first
            return try await store.removeChannel(app: redis.app, channel: "big")
        }
        await #expect(throws: CancellationError.self) { try await closing.value }
        #expect(try await redis.client.command(["HLEN", RedisKeys(app: redis.app).channel("big")]).int == 60)
        #expect(try await store.removeChannel(app: redis.app, channel: "big") == 60)
        #expect(try await redis.appKeys() == [])
    }

    @Test func aDevicesSubscriptionsPageInIdOrderAndGoInBatches() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client, batchSize: 4)
        let device = token()
        for n in 0..<25 { _ = try await store.upsert(app: redis.app, try subscription("c\(n)", device)) }
        var seen: [String] = [], after: String?, pages = 0
        repeat {
            let page = try await store.list(app: redis.app, deviceToken: device, after: after, limit: 10)
            #expect(page.subscriptions.count <= 10)
            seen += page.subscriptions.map(\.id)
            after = page.next
            pages += 1
        } while after != nil
        #expect(pages == 3 && seen.count == 25 && seen == seen.sorted() && Set(seen).count == 25)
        #expect(try await store.remove(app: redis.app, SubscriptionRemoval(json(#"{"deviceToken": "\#(device)"}"#))) == 25)
        #expect(try await redis.appKeys() == [])
    }
}

@Suite struct RateLimiterAndIdempotencyTests {
    @Test func theRequestOverTheLimitIsRefusedUntilTheWindowEnds() async throws {
        let redis = try TestRedis()
        let limiter = RateLimiter(redis: redis.client, limit: 5)
        let now = Date(timeIntervalSince1970: 1_800_000_010)
        for i in 1...5 {
            let decision = try await limiter.hit("key:1", app: redis.app, now: now)
            #expect(decision.allowed && decision.remaining == 5 - i && decision.resetSeconds == 50)
        }
        let over = try await limiter.hit("key:1", app: redis.app, now: now)
        #expect(!over.allowed && over.remaining == 0)
        #expect(try await limiter.hit("key:1", app: redis.app, now: now.addingTimeInterval(50)).allowed)
    }

    /// Per device within a shared ceiling: a device's refused requests do not use up the ceiling.
    @Test func devicesCountApartWithinTheKeysCeiling() async throws {
        let redis = try TestRedis()
        let limiter = RateLimiter(redis: redis.client, limit: 2, appLimit: 3)
        let now = Date(timeIntervalSince1970: 1_800_000_010)
        func hit(_ device: String) async throws -> RateLimiter.Decision {
            try await limiter.hit(limiter.window(for: "key:pub", device: device, app: redis.app, now: now))
        }
        #expect(try await hit("a") == .init(allowed: true, limit: 2, remaining: 1, resetSeconds: 50))
        #expect(try await hit("a") == .init(allowed: true, limit: 2, remaining: 0, resetSeconds: 50))
        for _ in 0..<5 { #expect(try await hit("a").allowed == false) }
        #expect(try await hit("b") == .init(allowed: true, limit: 3, remaining: 0, resetSeconds: 50),
                "the ceiling, closer to its limit, decides")
        #expect(try await hit("c") == .init(allowed: false, limit: 3, remaining: 0, resetSeconds: 50))
    }

    /// Two ingest processes (two limiters) under one public key's ceiling. A standalone Redis counts it in every
    /// call. A cluster counts it in each process, which sends its counts 100 ms later and asks Redis for the total
    /// when its last answer is older than that (`CeilingTally`): with the pauses here every count has been sent
    /// before the other process goes on, so the two together admit exactly the limit, the second learning from
    /// Redis what the first counted.
    @Test func processesShareTheKeysCeiling() async throws {
        let redis = try TestRedis()
        let limiters = [RateLimiter(redis: redis.client, limit: 1_000, appLimit: 50),
                        RateLimiter(redis: redis.client, limit: 1_000, appLimit: 50)]
        let now = Date(timeIntervalSince1970: 1_800_000_010)
        var device = 0
        func admitted(_ process: Int, _ requests: Int) async throws -> Int {
            var admitted = 0
            for _ in 0..<requests {
                device += 1
                let limiter = limiters[process]
                let window = limiter.window(for: "key:pub", device: "d\(device)", app: redis.app, now: now)
                if try await limiter.hit(window).allowed { admitted += 1 }
            }
            try await Task.sleep(for: .milliseconds(300)) // the counts are sent, and the last answer is old
            return admitted
        }
        #expect(try await admitted(0, 30) == 30)
        #expect(try await admitted(1, 40) == 20)
        #expect(try await admitted(0, 5) == 0)
        #expect(try await admitted(1, 5) == 0)
        if try await redis.client.isCluster() {
            let counter = RedisKeys(app: redis.app).rateLimit("key:pub", window: 1_800_000_010 / 60)
            #expect(try await redis.client.command(["GET", counter]).string == "50")
        }
    }

    /// A ceiling whose counter's node does not answer (failing over): a cluster decides on what the process has
    /// counted instead of refusing every device of the app, and still stops at the limit.
    @Test func aCeilingWhoseNodeDoesNotAnswerIsDecidedOnWhatIsKnown() async throws {
        let unanswered = RedisClient(configuration: RedisConfiguration(port: Int(try freePort()), poolSize: 1))
        defer { Task { await unanswered.close() } }
        let tally = CeilingTally()
        let ceiling = RateLimiter.Counter(redisKey: "herald:{t:k:x}:rl:1", limit: 3)
        var counts: [Int64?] = []
        for _ in 0..<5 { counts.append(await tally.claim(ceiling, window: 1, ttlSeconds: 61, redis: unanswered)) }
        #expect(counts == [1, 2, 3, nil, nil])
    }

    @Test func anIdPublishesOnce() async throws {
        let redis = try TestRedis()
        let store = IdempotencyStore(redis: redis.client)
        #expect(try await store.claim(app: redis.app, id: "e1", by: "a") == .claimed)
        #expect(try await store.claim(app: redis.app, id: "e1", by: "b") == .inProgress)
        try await store.release(app: redis.app, id: "e1", by: "b")
        #expect(try await store.claim(app: redis.app, id: "e1", by: "c") == .inProgress, "only its claimer frees it")
        try await store.release(app: redis.app, id: "e1", by: "a")
        #expect(try await store.claim(app: redis.app, id: "e1", by: "d") == .claimed)
        try await store.complete(app: redis.app, id: "e1")
        try await store.release(app: redis.app, id: "e1", by: "d")
        #expect(try await store.claim(app: redis.app, id: "e1", by: "e") == .alreadyPublished, "a release after the ack frees nothing")
    }

    /// An id used again once its window is over starts with no status: the earlier job's (kept longer) would
    /// read as this one's, done at once with its counts.
    @Test func anIdClaimedAgainStartsWithoutTheEarlierJobsStatus() async throws {
        let redis = try TestRedis()
        let store = IdempotencyStore(redis: redis.client, window: .seconds(1))
        let statuses = JobStatusStore(redis: redis.client)
        let job = PushJob(id: "e2-" + SecureRandom.hex(4), appId: redis.app, target: .channel("news"))
        #expect(try await store.claim(app: redis.app, id: job.id, by: "a") == .claimed)
        try await statuses.accepted(job)
        let finish = JobStatusStore.Finish(origin: .init(job), startedAt: "x", finishedAt: "2026-12-06T10:00:00Z")
        let progress = RedisKeys(app: redis.app).fanOut(group: "g", topic: "t", partition: 0, offset: 1, job: "j")
        try await statuses.settled(app: redis.app, jobID: job.id, progressKey: progress, progressTTL: nil, pushes: [],
                                   finish: finish)
        try await store.complete(app: redis.app, id: job.id)
        #expect(try await statuses.read(app: redis.app, jobID: job.id)?.state == .done)
        #expect(try await store.claim(app: redis.app, id: job.id, by: "a") == .alreadyPublished)
        try await Task.sleep(for: .milliseconds(2100))
        #expect(try await store.claim(app: redis.app, id: job.id, by: "a") == .claimed)
        #expect(try await statuses.read(app: redis.app, jobID: job.id) == nil)
    }

    /// Redis refusing the claim's write (here an ACL without `SET`; `OOM` and `READONLY` alike) is an error, not
    /// another request's claim: every retry would get 409 while Redis refuses.
    @Test(.enabled(if: !onCluster, "an ACL user set on one node")) func aClaimRedisRefusesThrows() async throws {
        let redis = try TestRedis()
        let user = "claim-" + SecureRandom.hex(4), password = SecureRandom.hex(16)
        try await redis.client.command(["ACL", "SETUSER", user, "on", ">" + password, "~*", "&*", "+@all", "-set"])
        let url = try TestEnvironment.redisURL().replacingOccurrences(of: "redis://", with: "redis://\(user):\(password)@")
        let refused = RedisClient(configuration: try RedisConfiguration(url: url))
        await #expect(throws: RedisError.self) { try await IdempotencyStore(redis: refused).claim(app: redis.app, id: "e3", by: "a") }
        await refused.close()
        try await redis.client.command(["ACL", "DELUSER", user])
    }
}

@Suite struct JobStatusStoreTests {
    @Test("a push marked in the progress record is counted once, and an ended job's status takes no second ending")
    func countsEachSettledPushOnce() async throws {
        let redis = try TestRedis()
        let store = JobStatusStore(redis: redis.client)
        let job = PushJob(id: "job-" + SecureRandom.hex(4), appId: redis.app, target: .channel("news"))
        let progress = RedisKeys(app: redis.app).fanOut(group: "g", topic: "t", partition: 0, offset: 7, job: "j")
        try await store.accepted(job)
        let queued = try #require(try await store.read(app: redis.app, jobID: job.id))
        #expect(queued.state == .queued && queued.target?["channel"]?.stringValue == "news")

        let fields = try await store.started(app: redis.app, origin: .init(job), startedAt: "2026-12-02T10:00:00Z",
                                             progressKey: progress, owner: "run-1")
        #expect(fields.isEmpty)
        let a = SettledPush(token: "aa", outcome: .delivered, retries: 0)
        let b = SettledPush(token: "bb", outcome: .tokenRemoved, retries: 1)
        let c = SettledPush(token: "cc", outcome: .deadLettered, retries: 4)
        try await store.settled(app: redis.app, jobID: job.id, progressKey: progress, progressTTL: .seconds(60), pushes: [a, b])
        // The first write again (a retried write whose reply was lost) and one more.
        try await store.settled(app: redis.app, jobID: job.id, progressKey: progress, progressTTL: .seconds(60), pushes: [a, b, c])
        let sending = try #require(try await store.read(app: redis.app, jobID: job.id))
        #expect(sending.state == .sending && sending.startedAt == "2026-12-02T10:00:00Z")
        var expected = JobStatus.Counts()
        (expected.delivered, expected.tokensRemoved, expected.deadLettered, expected.retried) = (1, 1, 1, 5)
        #expect(sending.counts == expected)
        let resumed = try await store.started(app: redis.app, origin: .init(job), startedAt: "2026-12-02T11:00:00Z",
                                              progressKey: progress, owner: "run-2")
        #expect(Set(resumed.keys) == ["s:aa", "s:bb", "s:cc"])

        let finish = JobStatusStore.Finish(origin: .init(job), startedAt: "x", finishedAt: "2026-12-02T10:05:00Z")
        try await store.settled(app: redis.app, jobID: job.id, progressKey: progress, progressTTL: .seconds(60), pushes: [],
                                finish: finish)
        var more = JobStatus.Counts()
        more.delivered = 10
        try await store.settled(app: redis.app, jobID: job.id, progressKey: progress, progressTTL: nil, pushes: [],
                                tally: more, finish: finish)
        // A revoked owner's late write of a push the new owner already counted, after the job ended: not counted.
        try await store.settled(app: redis.app, jobID: job.id, progressKey: progress, progressTTL: .seconds(60),
                                pushes: [SettledPush(token: "dd", outcome: .delivered, retries: 0)])
        let done = try #require(try await store.read(app: redis.app, jobID: job.id))
        #expect(done.state == .done && done.counts == expected && done.startedAt == "2026-12-02T10:00:00Z")
        #expect(try await redis.client.command(["HGETALL", progress]).strings == ["done", "1"])
        #expect(try await store.read(app: redis.app, jobID: "other") == nil)
    }

    /// A partition taken over mid fan-out: the revoked run's writes that land after the new run started count
    /// nothing, move no cursor and end nothing, even for a push whose mark the new run's cursor has forgotten.
    @Test("a revoked run's late writes change nothing once another run has started the job")
    func lateWritesOfARevokedRunChangeNothing() async throws {
        let redis = try TestRedis()
        let store = JobStatusStore(redis: redis.client)
        let job = PushJob(id: "job-" + SecureRandom.hex(4), appId: redis.app, target: .channel("news"))
        let progress = RedisKeys(app: redis.app).fanOut(group: "g", topic: "t", partition: 0, offset: 3, job: "j")
        let origin = JobStatusStore.Origin(job)
        func push(_ token: String) -> SettledPush { SettledPush(token: token, outcome: .delivered, retries: 0) }
        func settle(_ owner: String, _ tokens: [String], finish: Bool = false) async throws {
            try await store.settled(app: redis.app, jobID: job.id, progressKey: progress, progressTTL: .seconds(60),
                                    pushes: tokens.map(push),
                                    finish: finish ? .init(origin: origin, startedAt: "s", finishedAt: "2026-12-02T10:09:00Z") : nil,
                                    owner: owner)
        }
        func delivered() async throws -> Int { try #require(try await store.read(app: redis.app, jobID: job.id)).counts.delivered }

        _ = try await store.started(app: redis.app, origin: origin, startedAt: "2026-12-02T10:00:00Z", progressKey: progress, owner: "a")
        try await settle("a", ["t1"])
        // Run b takes over: it sees t1 settled, then its cursor passes t1 and forgets the mark.
        let seen = try await store.started(app: redis.app, origin: origin, startedAt: "2026-12-02T10:05:00Z", progressKey: progress, owner: "b")
        #expect(Set(seen.keys) == ["s:t1"])
        try await store.advanced(app: redis.app, jobID: job.id, progressKey: progress, progressTTL: .seconds(60), owner: "b",
                                 cursor: "17", covering: ["t1"])
        // Run a's late writes: t1 again (its mark gone), t2, a cursor and an ending.
        try await settle("a", ["t1", "t2"])
        try await store.advanced(app: redis.app, jobID: job.id, progressKey: progress, progressTTL: .seconds(60), owner: "a",
                                 cursor: "99", covering: ["t2"])
        try await settle("a", [], finish: true)
        #expect(try await delivered() == 1)
        #expect(try await redis.client.command(["HGETALL", progress]).fieldValues == ["cursor": "17"])
        #expect(try #require(try await store.read(app: redis.app, jobID: job.id)).state == .sending)
        // Run b sends t2 itself and ends the job.
        try await settle("b", ["t2"])
        try await settle("b", [], finish: true)
        #expect(try await delivered() == 2)
        #expect(try #require(try await store.read(app: redis.app, jobID: job.id)).state == .done)
    }

    /// The job produced again as a new record (README's fix for a `store_error` letter): its run starts the status
    /// afresh and ends it with its own counts; the first record run again still finds its job finished.
    @Test("a job produced again starts its status afresh; the record that finished it still sees it finished")
    func aJobProducedAgainStartsItsStatusAfresh() async throws {
        let redis = try TestRedis()
        let store = JobStatusStore(redis: redis.client)
        let job = PushJob(id: "job-" + SecureRandom.hex(4), appId: redis.app, target: .channel("news"))
        let keys = RedisKeys(app: redis.app)
        let (first, again) = (keys.fanOut(group: "g", topic: "t", partition: 0, offset: 4, job: job.id),
                              keys.fanOut(group: "g", topic: "t", partition: 1, offset: 9, job: job.id))
        let origin = JobStatusStore.Origin(job)
        func run(_ progress: String, owner: String, tokens: [String], jobDeadLettered: Bool = false) async throws {
            try await store.settled(app: redis.app, jobID: job.id, progressKey: progress, progressTTL: nil,
                                    pushes: tokens.map { SettledPush(token: $0, outcome: .deadLettered, retries: 0) },
                                    finish: .init(origin: origin, startedAt: "x", finishedAt: "2026-12-07T10:00:00Z",
                                                  jobDeadLettered: jobDeadLettered), owner: owner)
        }
        _ = try await store.started(app: redis.app, origin: origin, startedAt: "2026-12-07T09:00:00Z", progressKey: first, owner: "a")
        try await run(first, owner: "a", tokens: ["t1", "t2"], jobDeadLettered: true)
        #expect(try await store.read(app: redis.app, jobID: job.id)?.jobDeadLettered == true)

        let fresh = try await store.started(app: redis.app, origin: origin, startedAt: "2026-12-07T11:00:00Z",
                                            progressKey: again, owner: "b")
        #expect(fresh["done"] == nil)
        let restarted = try #require(try await store.read(app: redis.app, jobID: job.id))
        #expect(restarted.state == .sending && !restarted.jobDeadLettered && restarted.counts == JobStatus.Counts())
        #expect(restarted.startedAt == "2026-12-07T11:00:00Z")
        // The first record run again meanwhile (a rebalance before its commit) still finds the job finished by it.
        #expect(try await store.started(app: redis.app, origin: origin, startedAt: "y", progressKey: first, owner: "a2")["done"] == "1")
        #expect(try await store.read(app: redis.app, jobID: job.id) == restarted, "nothing written")
        try await store.settled(app: redis.app, jobID: job.id, progressKey: again, progressTTL: nil,
                                pushes: [SettledPush(token: "t1", outcome: .delivered, retries: 0)],
                                finish: .init(origin: origin, startedAt: "x", finishedAt: "2026-12-07T11:01:00Z"), owner: "b")
        let ended = try #require(try await store.read(app: redis.app, jobID: job.id))
        #expect(ended.state == .done && ended.counts.delivered == 1 && ended.counts.deadLettered == 0 && !ended.jobDeadLettered)
        for record in [first, again] {
            #expect(try await store.started(app: redis.app, origin: origin, startedAt: "z", progressKey: record, owner: "c")["done"] == "1")
        }
        try await redis.client.command(["DEL", keys.jobStatus(job.id), first, again])
    }

    @Test("a post's broadcasts are counted once each in its status, by outcome, and only by the run that started it")
    func countsBroadcastsOnce() async throws {
        let redis = try TestRedis()
        let store = JobStatusStore(redis: redis.client)
        let job = PushJob(id: "job-" + SecureRandom.hex(4), appId: redis.app, target: .post(String(repeating: "a", count: 64)))
        let keys = RedisKeys(app: redis.app)
        let progress = keys.fanOut(group: "g", topic: "t", partition: 0, offset: 1, job: job.id)
        _ = try await store.started(app: redis.app, origin: JobStatusStore.Origin(job), startedAt: "2026-12-07T09:00:00Z",
                                    progressKey: progress, owner: "a")
        func mark(_ channel: String, delivered: Bool, exhausted: Bool = false, owner: String = "a") async throws {
            try await store.broadcastSettled(app: redis.app, jobID: job.id, progressKey: progress, channelID: channel,
                                             delivered: delivered, exhausted: exhausted, progressTTL: .seconds(60), owner: owner)
        }
        try await mark("c1", delivered: true)
        try await mark("c2", delivered: false, exhausted: true)
        try await mark("c1", delivered: true)  // written again: counted once
        try await mark("c3", delivered: true, owner: "revoked")  // a run whose partition was taken over
        let status = try #require(try await store.read(app: redis.app, jobID: job.id))
        #expect(status.counts.broadcasts == 1 && status.counts.broadcastsDeadLettered == 1, "\(status.counts)")
        #expect(status.jsonValue["counts"]?["broadcasts"]?.numberValue == 1)
        #expect(try await redis.client.command(["HGET", progress, "b:c2"]).string == "x")
        #expect(try await redis.client.command(["HEXISTS", progress, "b:c3"]).int == 0)
        // A broadcast job's one broadcast is counted with its end, and nothing counts after the end.
        var tally = JobStatus.Counts()
        tally.broadcasts = 1
        try await store.settled(app: redis.app, jobID: job.id, progressKey: progress, progressTTL: nil, pushes: [],
                                tally: tally, finish: .init(origin: JobStatusStore.Origin(job), startedAt: "x",
                                                            finishedAt: "2026-12-07T09:01:00Z"), owner: "a")
        try await mark("c4", delivered: true)
        let ended = try #require(try await store.read(app: redis.app, jobID: job.id))
        #expect(ended.state == .done && ended.counts.broadcasts == 2 && ended.counts.broadcastsDeadLettered == 1,
                "\(ended.counts)")
        try await redis.client.command(["DEL", keys.jobStatus(job.id), progress])
    }

    @Test("a write of thousands of settled pushes marks each once: counted once however often it is written")
    func marksLargeWritesOncePerPush() async throws {
        let redis = try TestRedis()
        let store = JobStatusStore(redis: redis.client)
        let job = PushJob(id: "job-" + SecureRandom.hex(4), appId: redis.app, target: .channel("big"))
        let progress = RedisKeys(app: redis.app).fanOut(group: "g", topic: "t", partition: 1, offset: 9, job: "j")
        func pushes(_ outcome: SettledPush.Outcome, _ range: Range<Int>, retries: Int = 0) -> [SettledPush] {
            range.map { SettledPush(token: "\(outcome.rawValue)\($0)", outcome: outcome, retries: retries) }
        }
        // More than one HSET's worth of delivered pushes, interleaved with the other outcomes and retried ones.
        let first = pushes(.delivered, 0..<2_500) + pushes(.tokenRemoved, 0..<1_200) + pushes(.deadLettered, 0..<3)
            + pushes(.delivered, 2_500..<2_502, retries: 2)
        try await store.settled(app: redis.app, jobID: job.id, progressKey: progress, progressTTL: .seconds(60),
                                pushes: first.shuffled())
        // Half of it again (a write whose reply was lost) with new ones.
        let second = Array(first.prefix(1_800)) + pushes(.delivered, 5_000..<5_010) + pushes(.tokenRemoved, 1_200..<1_201, retries: 1)
        try await store.settled(app: redis.app, jobID: job.id, progressKey: progress, progressTTL: .seconds(60),
                                pushes: second.shuffled())
        let status = try #require(try await store.read(app: redis.app, jobID: job.id))
        var expected = JobStatus.Counts()
        (expected.delivered, expected.tokensRemoved, expected.deadLettered, expected.retried) = (2_512, 1_201, 3, 5)
        #expect(status.counts == expected)
        #expect(try await redis.client.command(["HLEN", progress]).int == 2_512 + 1_201 + 3)
        #expect(try await redis.client.command(["HGET", progress, "s:r7"]).string == "r")
    }

    @Test("a job without a progress record writes its tally once, with its ending")
    func tallyWithTheEnding() async throws {
        let redis = try TestRedis()
        let store = JobStatusStore(redis: redis.client, ttl: .seconds(120))
        let job = PushJob(id: "job-" + SecureRandom.hex(4), appId: redis.app, target: .channel("news"))
        let progress = RedisKeys(app: redis.app).fanOut(group: "g", topic: "t", partition: 0, offset: 8, job: "j")
        var tally = JobStatus.Counts()
        tally.delivered = 3
        let finish = JobStatusStore.Finish(origin: .init(job), startedAt: "2026-12-02T10:00:00Z",
                                           finishedAt: "2026-12-02T10:00:01Z")
        try await store.settled(app: redis.app, jobID: job.id, progressKey: progress, progressTTL: nil,
                                pushes: [SettledPush(token: "dd", outcome: .deadLettered, retries: 2),
                                         SettledPush(token: "ee", outcome: .deadLettered, retries: 0),
                                         SettledPush(token: "ff", outcome: .delivered, retries: 0)], tally: tally,
                                finish: finish)
        let done = try #require(try await store.read(app: redis.app, jobID: job.id))
        #expect(done.state == .done && done.counts.delivered == 4 && done.counts.deadLettered == 2 && done.counts.retried == 2)
        #expect(done.acceptedAt == job.createdAt && done.target?["kind"]?.stringValue == "channel")
        #expect(try await redis.client.command(["EXISTS", progress]).int == 0, "no progress record")
        let ttl = try await redis.client.command(["TTL", RedisKeys(app: redis.app).jobStatus(job.id)]).int ?? 0
        #expect(ttl > 60 && ttl <= 120)
    }
}

/// `examples/redis-acl-rules.txt` is the Redis user README tells operators to give Herald: every command the
/// stores run, scripts' inner calls included, must be allowed to it. (On a cluster `ACL SETUSER` reaches one node
/// only: this runs on standalone Redis.)
@Suite struct LeastPrivilegeUserTests {
    static var standalone: Bool { !((try? TestEnvironment.redisURL()) ?? ",").contains(",") }

    @Test("every store operation runs as the documented least-privilege user", .enabled(if: standalone))
    func storesRunAsTheDocumentedUser() async throws {
        let admin = try TestRedis()
        let user = "herald-acl-" + SecureRandom.hex(4), password = SecureRandom.hex(16)
        _ = try await admin.client.command(["ACL", "SETUSER", user, "on", ">" + password] + heraldRedisACL)
        let url = try TestEnvironment.redisURL().replacingOccurrences(of: "redis://", with: "redis://\(user):\(password)@")
        let redis = RedisClient(configuration: try RedisConfiguration(url: url))
        let app = admin.app, device = token(), now = Date()

        let subscriptions = SubscriptionStore(redis: redis)
        let limiter = RateLimiter(redis: redis, limit: 100)
        _ = try await subscriptions.upsert(app: app, try subscription("order:1:status", device),
                                           counting: limiter.window(for: "key:pub", device: device, app: app, now: now))
        _ = try await subscriptions.list(app: app, deviceToken: device)
        _ = try await limiter.hit(limiter.ceilingWindow(for: "key:pub", app: app, now: now))
        // A cluster counts a public key's ceiling by batches (CeilingTally), with a script of its own.
        _ = try await redis.run(CeilingTally.add, keys: ["herald:{\(app)}:ceiling-test"], args: ["1", "61"])
        let activities = ActivityStore(redis: redis)
        let push = token()
        _ = try await activities.register(app: app, user: "u",
                                          try ActivityStoreTests.input(try ActivityStoreTests.app(), post: "0123abcd", token: push))
        let channels = BroadcastChannelStore(redis: redis)
        let channel = BroadcastChannel(channelID: "dHN0LXNydHktY2hubA==", environment: .production,
                                       storagePolicy: .noStorage, createdAt: Timestamp.rfc3339(now))
        _ = try await channels.save(app: app, postIDHash: "0123abcd", channel)
        _ = try await channels.channels(app: app, postIDHash: "0123abcd")
        try await channels.markEnvironmentUsed(app: app, .production)
        #expect(try await channels.usedEnvironments(app: app) == [.production])
        let idempotency = IdempotencyStore(redis: redis)
        _ = try await idempotency.claim(app: app, id: "event-1", by: "a")
        try await idempotency.release(app: app, id: "event-1", by: "a")
        _ = try await idempotency.claim(app: app, id: "event-1", by: "b")
        try await idempotency.complete(app: app, id: "event-1")
        let status = JobStatusStore(redis: redis)
        let job = PushJob(id: "job-" + SecureRandom.hex(4), appId: app, target: .channel("order:1:status"))
        try await status.accepted(job)
        _ = try await status.read(app: app, jobID: job.id)
        #expect(try await subscriptions.removeInvalidToken(app: app, deviceToken: device) == 1)
        #expect(try await activities.removeInvalidToken(app: app, pushToken: push) == 1)
        try await channels.remove(app: app, postIDHash: "0123abcd", channel)
        // A scan past its first page names the Redis process that gave the cursor (`INFO`, in the ACL too), so a
        // fan-out notices another process (a failover) before its cursor skips targets.
        let big = RedisKeys(app: app).channel("big")
        _ = try await admin.client.command(["HSET", big] + (0..<600).flatMap { ["f\($0)", "x"] })
        let page = try await subscriptions.channelBatch(app: app, channel: "big", cursor: "0", count: 10)
        #expect(page.cursor != "0" && page.server?.count == 12, "\(page.cursor) \(String(describing: page.server))")
        #expect(try await subscriptions.channelBatch(app: app, channel: "big", cursor: page.cursor, count: 10).server == page.server)
        #expect(try await subscriptions.channelBatch(app: app, channel: "order:1:status", cursor: "0").server == nil,
                "a channel read whole at once needs no server")
        _ = try await admin.client.command(["DEL", big])

        await redis.close()
        _ = try await admin.client.command(["ACL", "DELUSER", user])
    }
}

@Suite struct BroadcastChannelStoreTests {
    /// An answer about a post's old channel (a late ChannelNotRegistered, a second janitor's delete) forgets that
    /// channel only, never the one made after it.
    @Test func removingAnOldChannelKeepsItsSuccessor() async throws {
        let redis = try TestRedis()
        let store = BroadcastChannelStore(redis: redis.client)
        func channel(_ id: String) -> BroadcastChannel {
            BroadcastChannel(channelID: id, environment: .production, storagePolicy: .noStorage, createdAt: "2026-12-06T00:00:00Z")
        }
        let old = channel("b2xkLWNoYW5uZWw="), new = channel("bmV3LWNoYW5uZWw=")
        _ = try await store.save(app: redis.app, postIDHash: "0123abcd", old)
        try await store.remove(app: redis.app, postIDHash: "0123abcd", old)
        _ = try await store.save(app: redis.app, postIDHash: "0123abcd", new)
        try await store.remove(app: redis.app, postIDHash: "0123abcd", old)
        #expect(try await store.channels(app: redis.app, postIDHash: "0123abcd") == [new])
        #expect(try await store.indexedChannels(app: redis.app).map(\.post) == ["0123abcd"])
        try await store.remove(app: redis.app, postIDHash: "0123abcd", new)
        #expect(try await store.channels(app: redis.app, postIDHash: "0123abcd").isEmpty)
        #expect(try await store.indexedChannels(app: redis.app).isEmpty)
    }
}
