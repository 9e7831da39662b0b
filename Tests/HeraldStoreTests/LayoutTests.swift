import Foundation
import HeraldCore
import HeraldCrypto
import HeraldRedis
import HeraldRuntime
import HeraldStore
import HeraldTestSupport
import Testing

/// Whether this pass of the suites runs against the test cluster.
let onCluster = ProcessInfo.processInfo.environment["HERALD_TEST_REDIS_URL"]?.contains(",") == true

/// The key layout's marker and the move from layout 1 (every key of an app under `{app}`), on a database of the
/// standalone Redis of its own.
@Suite(.serialized, .enabled(if: !onCluster, "a database of its own: a cluster has only database 0"))
struct RedisLayoutTests {
    let redis: RedisClient
    let app = "test-" + SecureRandom.hex(6)

    init() async throws {
        let url = try TestEnvironment.redisURL()
        redis = RedisClient(configuration: try RedisConfiguration(url: String(url[..<url.lastIndex(of: "/")!]) + "/7"))
        try await redis.command(["FLUSHDB"])
    }

    @Test func aNewDatabaseIsMarkedAndAnotherLayoutIsRefusedSayingWhatToRun() async throws {
        let logger = Logger(label: "test", minimumLevel: .error)
        try await RedisLayout.prepare(redis, logger: logger)
        #expect(try await redis.command(["GET", RedisLayout.key]).string == String(RedisLayout.current))
        try await redis.command(["SET", RedisLayout.key, "99"])
        await #expect(throws: LayoutError.self) { try await RedisLayout.prepare(redis, logger: logger) }
        try await redis.command(["DEL", RedisLayout.key])
        // Keys of this layout only (tests and tools write without the marker): still a new database.
        _ = try await SubscriptionStore(redis: redis).upsert(app: app, try subscription("news", token()))
        #expect(try await RedisLayout.version(of: redis) == nil)
        try await writeLayout1(token(), "news", id: "0123456789abcdef01234567", expiresAt: nil)
        #expect(try await RedisLayout.version(of: redis) == 1)
        do {
            try await RedisLayout.prepare(redis, logger: logger)
            Issue.record("layout 1 was accepted")
        } catch let error as LayoutError {
            #expect(error.description.contains("heraldctl redis migrate"))
        }
        #expect(try await redis.command(["EXISTS", RedisLayout.key]).int == 0, "a refused database is left unmarked")
    }

    /// Subscriptions and their indexes as the scripts of layout 1 wrote them, then a dry run, the migration and a
    /// second run; afterwards the same subscriptions list, push and go as before, and nothing of layout 1 is left.
    @Test func aLayout1DatabaseMigratesAndServesTheSameSubscriptions() async throws {
        let store = SubscriptionStore(redis: redis)
        let activities = ActivityStore(redis: redis)
        let devices = (0..<30).map { _ in token() }
        let expiry = Int64(Date().timeIntervalSince1970) + 3600
        var written: [String: [String]] = [:] // channel → tokens
        for (n, device) in devices.enumerated() {
            for channel in ["order:\(n % 3):status", "news"] where n % 2 == 0 || channel == "news" {
                let id = String(SHA256.hash(Array("\(device)\nalert\n\(channel)".utf8)).prefix(12).map { String(format: "%02x", $0) }.joined())
                try await writeLayout1(device, channel, id: id, expiresAt: n % 5 == 0 ? nil : expiry)
                written[channel, default: []].append(device)
            }
        }
        // A stale device index entry (its record is gone), which layout 1's scripts tolerated.
        try await redis.command(["SADD", "herald:{\(app)}:dev:\(devices[1])", "ffffffffffffffffffffffff"])
        // Two Live Activity registrations of one post as layout 1's register script wrote them (50 min left).
        let pushTokens = [token(), token()]
        let nowMs = Int64(Date().timeIntervalSince1970 * 1000), expiryMs = String(nowMs + 3_000_000)
        for (n, pushToken) in pushTokens.enumerated() {
            let id = String(format: "%024d", n), prefix = "herald:{\(app)}:"
            try await redis.command(["HSET", prefix + "act:" + id, "createdAt", "2026-12-03T10:00:00.000Z", "user", "u\(n)",
                                     "postIdHash", "aaaa1111", "pushToken", pushToken, "environment", "production",
                                     "bundleId", "com.example.app", "lastSeenMs", String(nowMs - 600_000)])
            try await redis.command(["PEXPIRE", prefix + "act:" + id, "3000000"])
            try await redis.command(["ZADD", prefix + "post:aaaa1111", expiryMs, id])
            try await redis.command(["ZADD", prefix + "acttok:" + pushToken, expiryMs, id])
            try await redis.command(["PEXPIRE", prefix + "post:aaaa1111", "3060000"])
            try await redis.command(["PEXPIRE", prefix + "acttok:" + pushToken, "3060000"])
        }
        let total = written.values.reduce(0) { $0 + $1.count }

        let dryRun = try await RedisLayout.migrate(redis, dryRun: true)
        #expect(dryRun.subscriptions == [app: total] && dryRun.registrations == [app: 2])
        #expect(try await RedisLayout.version(of: redis) == 1, "a dry run changes nothing")

        var reported: [Int] = []
        let migration = try await RedisLayout.migrate(redis, batchSize: 7) { reported.append($0) }
        #expect(migration.subscriptions == [app: total] && migration.registrations == [app: 2])
        #expect(migration.oldIndexes == 1, "the device index left holding only its stale entry")
        #expect(try await RedisLayout.version(of: redis) == RedisLayout.current)
        #expect(try await layout1Keys().isEmpty, "nothing of layout 1 is left")

        for (channel, tokens) in written {
            var seen: [String] = [], cursor = "0"
            repeat {
                let batch = try await store.channelBatch(app: app, channel: channel, cursor: cursor)
                seen += batch.targets.map(\.deviceToken)
                cursor = batch.cursor
            } while cursor != "0"
            #expect(seen.sorted() == tokens.sorted(), "channel \(channel)")
        }
        let listed = try await store.list(app: app, deviceToken: devices[0]).subscriptions
        #expect(Set(listed.map(\.channel)) == ["order:0:status", "news"])
        #expect(listed.allSatisfy { $0.metadata == json(#"{"locale": "en_US"}"#) && $0.createdAt == "2026-11-30T12:00:00Z" })
        #expect(try await store.list(app: app, deviceToken: devices[1]).subscriptions.map(\.channel) == ["news"])
        // The expiry index came along: subscriptions that expire are swept when they do, the others never.
        let later = Date(timeIntervalSince1970: TimeInterval(expiry + 1))
        #expect(try await store.expire(app: app, now: later) == total - 9)
        let unexpired = try await store.list(app: app, deviceToken: devices[0], now: later).subscriptions
        #expect(unexpired.count == 2, "device 0's never expire")
        // The registrations too, with the time they had left, and a 410 still finds them by token.
        let moved = try await activities.postBatch(app: app, postIDHash: "aaaa1111", cursor: "0").registrations
        #expect(moved.map(\.pushToken).sorted() == pushTokens.sorted() && moved.allSatisfy { $0.createdAt == "2026-12-03T10:00:00.000Z" })
        let left = try await redis.command(["PTTL", RedisKeys(app: app).registration(moved[0].id, post: "aaaa1111")]).int ?? 0
        #expect(left > 2_900_000 && left <= 3_000_000)
        #expect(try await activities.removeInvalidToken(app: app, pushToken: pushTokens[0]) == 1)
        #expect(try await activities.postBatch(app: app, postIDHash: "aaaa1111", cursor: "0").registrations.map(\.pushToken) == [pushTokens[1]])

        // A second run, and one after a copy of layout 1 reappeared (a run stopped between its writes), converge.
        #expect(try await RedisLayout.migrate(redis).total == 0)
        try await writeLayout1(devices[0], "news", id: listed.first { $0.channel == "news" }!.id, expiresAt: nil)
        #expect(try await RedisLayout.migrate(redis).total == 1)
        #expect(try await store.list(app: app, deviceToken: devices[0]).subscriptions.count == 2)
        #expect(try await layout1Keys().isEmpty)
    }

    /// Redis refusing the writes of this layout (here an ACL without `HSET`; `OOM` at maxmemory refuses them alike
    /// while it still deletes), or answering the reads with an error (without `HGETALL`; a node loading or failing
    /// over answers alike, and a record read so would be taken for unreadable and only deleted), fails the run and
    /// leaves every record in layout 1, for the next run to move.
    @Test(arguments: ["hset", "hgetall"]) func aRunWhoseCommandsAreRefusedDeletesNothing(refused command: String) async throws {
        let devices = (0..<5).map { _ in token() }
        for (n, device) in devices.enumerated() { try await writeLayout1(device, "news", id: String(format: "%024d", n), expiresAt: nil) }
        let before = try await layout1Keys().sorted()
        let user = "migrate-" + SecureRandom.hex(4), password = SecureRandom.hex(16)
        try await redis.command(["ACL", "SETUSER", user, "on", ">" + password, "~*", "&*", "+@all", "-" + command])
        let url = try TestEnvironment.redisURL()
        let database7 = String(url[..<url.lastIndex(of: "/")!]) + "/7"
        let refused = RedisClient(configuration: try RedisConfiguration(
            url: database7.replacingOccurrences(of: "redis://", with: "redis://\(user):\(password)@")))
        await #expect(throws: (any Error).self) { try await RedisLayout.migrate(refused) }
        await refused.close()
        try await redis.command(["ACL", "DELUSER", user])
        #expect(try await layout1Keys().sorted() == before, "every old key is still there")
        #expect(try await RedisLayout.migrate(redis).subscriptions == [app: 5], "the next run moves them all")
        #expect(try await layout1Keys().isEmpty)
    }

    /// The dispatcher's consumer and sweeps run gated by the check: not while Redis cannot be reached, never on
    /// another layout (the group stops with `LayoutError`), at once on this one.
    @Test func gatedPartsStartOnlyOnceTheLayoutCheckPassed() async throws {
        struct Started: Service {
            let count: Lock<Int>
            func run() async { count.withLock { $0 += 1 }; await waitForCancellation() }
        }
        let logger = Logger(label: "test", minimumLevel: .error)
        let started = Lock(0)
        func group(_ client: RedisClient) -> ServiceGroup {
            let check = RedisLayoutCheck(redis: client, logger: logger)
            return ServiceGroup(services: [check, check.gating(Started(count: started))], signals: [], logger: logger)
        }
        let unreachable = RedisClient(configuration: try RedisConfiguration(url: "redis://127.0.0.1:1/0"))
        let waiting = Task { try await group(unreachable).run() }
        try await Task.sleep(for: .milliseconds(1500))
        #expect(started.withLock { $0 } == 0, "started while Redis could not be reached")
        waiting.cancel()
        _ = try? await waiting.value
        await unreachable.close()

        try await writeLayout1(token(), "news", id: "0123456789abcdef01234567", expiresAt: nil)
        await #expect(throws: LayoutError.self) { try await group(redis).run() }
        #expect(started.withLock { $0 } == 0, "started on layout 1")

        _ = try await RedisLayout.migrate(redis)
        let running = Task { try await group(redis).run() }
        let deadline = ContinuousClock.now + .seconds(5)
        while started.withLock({ $0 }) == 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(started.withLock { $0 } == 1, "not started on this layout")
        running.cancel()
        try await running.value
    }

    /// One subscription as layout 1's upsert script wrote it: the record, the channel index, the device index and
    /// the expiry index, all under `{app}`.
    private func writeLayout1(_ device: String, _ channel: String, id: String, expiresAt: Int64?) async throws {
        let prefix = "herald:{\(app)}:", expires = expiresAt.map(String.init) ?? ""
        try await redis.command(["HSET", prefix + "sub:" + id, "createdAt", "2026-11-30T12:00:00Z", "id", id,
                                 "channel", channel, "deviceToken", device, "tokenType", "alert",
                                 "environment", "production", "activityID", "", "metadata", #"{"locale":"en_US"}"#,
                                 "updatedAt", "2026-11-30T12:00:00Z", "updatedMs", "1764504000000", "expiresAt", expires])
        try await redis.command(["HSET", prefix + "ch:" + channel, id, "ap" + (expiresAt.map { "~\($0)~" } ?? "") + device])
        try await redis.command(["SADD", prefix + "dev:" + device, id])
        if let expiresAt { try await redis.command(["ZADD", prefix + "subexp", String(expiresAt), id]) }
    }

    private func layout1Keys() async throws -> [String] {
        try await redis.command(["KEYS", "herald:{\(app)}:*"]).strings ?? []
    }
}

/// One app's subscriptions spread over the test cluster's three masters.
@Suite(.enabled(if: onCluster, "needs the test cluster (the cluster pass of scripts/test)"))
struct SubscriptionSpreadTests {
    @Test func oneAppsSubscriptionsSpreadEvenlyOverTheMasters() async throws {
        let redis = try TestRedis()
        let store = SubscriptionStore(redis: redis.client)
        let masters = try await redis.client.masters()
        #expect(masters.count == 3)
        func usage() async throws -> [(keys: Int64, memory: Int64)] {
            var result: [(Int64, Int64)] = []
            for master in masters {
                let keys = try await master.command(["DBSIZE"]).int ?? 0
                let info = try await master.command(["INFO", "memory"]).string ?? ""
                let used = info.split(whereSeparator: \.isNewline).first { $0.hasPrefix("used_memory:") }
                    .flatMap { Int64($0.dropFirst("used_memory:".count)) } ?? 0
                result.append((keys, used))
            }
            return result
        }
        let before = try await usage()
        let subscriptions = 100_000, channels = 1_000, workers = 48
        try await withThrowingTaskGroup(of: Void.self) { group in
            for worker in 0..<workers {
                group.addTask {
                    for n in stride(from: worker, to: subscriptions, by: workers) {
                        _ = try await store.upsert(app: redis.app, try subscription("channel:\(n % channels)", token()))
                    }
                }
            }
            try await group.waitForAll()
        }
        let after = try await usage()
        let keys = zip(before, after).map { Double($1.keys - $0.keys) }
        let memory = zip(before, after).map { Double($1.memory - $0.memory) }
        for (name, values) in [("keys", keys), ("memory", memory)] {
            let mean = values.reduce(0, +) / Double(values.count)
            let spread = values.map { ($0 - mean) / mean }
            print("spread of \(subscriptions) subscriptions on \(channels) channels, \(name) per master: "
                  + values.map { String(Int($0)) }.joined(separator: " ") + " (from even: "
                  + spread.map { String(format: "%+.1f%%", $0 * 100) }.joined(separator: " ") + ")")
            #expect(spread.allSatisfy { abs($0) <= 0.2 }, "\(name): \(values)")
        }
        // Every subscription is reachable from its channel.
        var reached = 0
        for channel in 0..<channels {
            var cursor = "0"
            repeat {
                let batch = try await store.channelBatch(app: redis.app, channel: "channel:\(channel)", cursor: cursor)
                reached += batch.targets.count
                cursor = batch.cursor
            } while cursor != "0"
        }
        #expect(reached == subscriptions)
        for master in masters {
            let keys = try await master.command(["KEYS", "herald:{\(redis.app)[:}]*"]).strings ?? []
            for start in stride(from: 0, to: keys.count, by: 1000) {
                _ = try await redis.client.pipeline(keys[start..<min(start + 1000, keys.count)].map { ["UNLINK", $0] })
            }
        }
    }
}
