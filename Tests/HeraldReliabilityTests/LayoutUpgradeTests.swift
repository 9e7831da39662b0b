import Foundation
import HeraldCore
import HeraldCrypto
import HeraldRedis
import HeraldRuntime
import HeraldStore
import HeraldTestSupport
import Testing

/// An upgrade from key layout 1 as an operator goes through it, with the built executables.
@Suite("Upgrading the Redis key layout", .serialized)
struct LayoutUpgradeTests {
    /// A database of the test's own (database 9 of the standalone Redis) holding a subscription as layout 1 wrote
    /// it: herald-ingest refuses to start and says what to run; `heraldctl redis migrate --dry-run` counts it and
    /// changes nothing; `heraldctl redis migrate` moves it; then herald-ingest starts and lists the subscription.
    @Test("ingest refuses an old layout naming the command; heraldctl redis migrate moves it; ingest then serves it")
    func refuseMigrateServe() async throws {
        let directory = try scratchDirectory("herald-layout-")
        let apps = try TestApps(count: 1)
        defer { apps.remove() }
        let base = try TestEnvironment.redisURL()
        let redisURL = String(base[..<base.lastIndex(of: "/")!]) + "/9"
        let redis = RedisClient(configuration: try RedisConfiguration(url: redisURL))
        try await redis.command(["FLUSHDB"])
        let app = apps.apps[0], device = SecureRandom.hex(32), id = "0123456789abcdef01234567", prefix = "herald:{\(app.id)}:"
        try await redis.command(["HSET", prefix + "sub:" + id, "createdAt", "2026-11-30T12:00:00Z", "id", id,
                                 "channel", "order:7:status", "deviceToken", device, "tokenType", "alert",
                                 "environment", "production", "activityID", "", "metadata", "",
                                 "updatedAt", "2026-11-30T12:00:00Z", "updatedMs", "1764504000000", "expiresAt", ""])
        try await redis.command(["HSET", prefix + "ch:order:7:status", id, "ap" + device])
        try await redis.command(["SADD", prefix + "dev:" + device, id])
        let topics = FaultTopics(brokers: try TestEnvironment.kafkaBrokers())
        try await topics.create(partitions: 1)

        let refused = try IngestServer(apps: apps, redisURL: redisURL, topics: topics, directory: directory, name: "ingest-old")
        #expect(await refused.child.waitForExit(timeout: .seconds(30)) == 1, "ingest did not stop on layout 1")
        #expect(refused.child.log.contains("heraldctl redis migrate"), "the log does not say what to run")

        let environment = ["HERALD_REDIS_URL": redisURL]
        let dryRun = try await heraldctl(["redis", "migrate", "--dry-run"], environment: environment, directory: directory)
        #expect(dryRun.status == 0 && dryRun.output.contains("1 subscriptions would move"), "\(dryRun.output)")
        #expect(try await redis.command(["EXISTS", prefix + "sub:" + id]).int == 1, "the dry run changed nothing")
        let migrated = try await heraldctl(["redis", "migrate"], environment: environment, directory: directory)
        #expect(migrated.status == 0 && migrated.output.contains("1 subscriptions moved"), "\(migrated.output)")

        let ingest = try IngestServer(apps: apps, redisURL: redisURL, topics: topics, directory: directory, name: "ingest")
        try await ingest.waitUntilReady()
        let listed = try await ingest.request("GET", "/v1/apps/\(app.id)/subscriptions?deviceToken=\(device)", key: app.secretKey)
        #expect(listed.status == 200 && listed.text.contains("order:7:status") && listed.text.contains(id), "\(listed.text)")
        await ingest.child.stop()
        await redis.close()
        cleanUp(directory, keep: false)
    }
}
