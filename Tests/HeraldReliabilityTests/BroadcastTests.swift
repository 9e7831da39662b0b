import Foundation
import HeraldAPNs
import HeraldCore
import HeraldCrypto
import HeraldRedis
import HeraldRuntime
import HeraldStore
import HeraldTestSupport
import Testing

@Suite("Broadcast channels", .serialized)
struct BroadcastTests {
    /// Ingest, dispatcher and simulator as processes: a post's channel is made once (idempotent), devices read it
    /// with the public key, each update is one broadcast besides the registered tokens' pushes, and the final
    /// update deletes the channel. An app without the Broadcast capability gets Apple's reason back.
    @Test("create a post's channels in both environments, read one, publish an update and the end as one broadcast per channel each, then both are deleted")
    func aPostsChannelFromCreateToEnd() async throws {
        let directory = try scratchDirectory("herald-broadcast-")
        let apps = try TestApps(count: 2)
        defer { apps.remove() }
        let topics = FaultTopics(brokers: try TestEnvironment.kafkaBrokers())
        let (app, other) = (apps.apps[0], apps.apps[1])
        let stack = try await FaultStack.start(apps: apps, redisURL: try TestEnvironment.redisURL(), topics: topics,
                                               directory: directory, channelCount: 1, perChannel: 1,
                                               noBroadcast: [other.bundleID])
        let (simulator, ingest) = (stack.simulator, stack.ingest)
        let post = SecureRandom.hex(8)
        let path = "/v1/apps/\(app.id)/activities/\(post)/broadcast"

        let created = try await ingest.request("POST", path, key: app.secretKey, json: #"{"environment": "production"}"#)
        try #require(created.status == 201, "\(created.text)")
        let channel = try #require(JSONValue(parsing: Array(created.text.utf8)))
        let channelID = try #require(channel["channelId"]?.stringValue)
        #expect(channel["storagePolicy"]?.stringValue == "noStorage" && channel["environment"]?.stringValue == "production")
        let again = try await ingest.request("POST", path, key: app.secretKey, json: #"{"environment": "production"}"#)
        #expect(again.status == 200 && again.text.contains(channelID), "idempotent: \(again.text)")
        let otherPolicy = try await ingest.request("POST", path, key: app.secretKey,
                                                   json: #"{"environment": "production", "storagePolicy": "mostRecentMessage"}"#)
        #expect(otherPolicy.status == 409, "\(otherPolicy.text)")
        let bad = try await ingest.request("POST", path, key: app.secretKey, json: #"{"environment": "staging"}"#)
        #expect(bad.status == 400, "\(bad.text)")
        #expect(try await ingest.request("POST", path, key: app.publicKey, json: #"{"environment": "production"}"#).status == 403)

        let read = try await ingest.request("GET", path + "?environment=production", key: app.publicKey)
        #expect(read.status == 200 && read.text.contains(channelID), "\(read.text)")
        let missing = try await ingest.request("GET", path + "?environment=sandbox", key: app.publicKey)
        #expect(missing.status == 404)
        let unsaid = try await ingest.request("GET", path, key: app.publicKey)
        #expect(unsaid.status == 400)
        // The answers as schemas/openapi.yaml documents them (check-openapi runs no dispatcher, so no channel).
        try await onThread {
            try validateAgainstOpenAPI([created.body, again.body, read.body], pointer: "#/components/schemas/BroadcastChannel")
            try validateAgainstOpenAPI([otherPolicy.body, bad.body, missing.body, unsaid.body], pointer: "#/components/schemas/Error")
        }
        // Development builds of the app join a sandbox channel: each update goes to both.
        let sandbox = try await ingest.request("POST", path, key: app.secretKey, json: #"{"environment": "sandbox"}"#)
        try #require(sandbox.status == 201, "\(sandbox.text)")
        let sandboxID = try #require(JSONValue(parsing: Array(sandbox.text.utf8))?["channelId"]?.stringValue)
        #expect(sandboxID != channelID)

        // Two devices on older iOS registered their tokens: they still get a push each.
        let tokens = [SecureRandom.hex(32), SecureRandom.hex(32)]
        for token in tokens {
            let registered = try await ingest.request("POST", "/v1/apps/\(app.id)/activities/register", key: app.publicKey,
                                                      json: #"{"push_token": "\#(token)", "post_id_hash": "\#(post)", "bundle_id": "\#(app.bundleID)"}"#)
            #expect(registered.status == 201, "\(registered.text)")
        }
        let events = "/v1/apps/\(app.id)/activities/\(post)/events"
        let update = try await ingest.request("POST", events, key: app.secretKey,
                                              json: #"{"event": "update", "contentState": {"step": "picked"}}"#)
        try #require(update.status == 202, "\(update.text)")
        try await eventually("the update broadcast and pushed", timeout: .seconds(30)) {
            simulator.broadcasts().count == 2 && simulator.acceptedCount() >= tokens.count
        }
        let end = try await ingest.request("POST", events, key: app.secretKey,
                                           json: #"{"event": "end", "contentState": {"step": "delivered"}, "final": true}"#)
        try #require(end.status == 202, "\(end.text)")
        try await eventually("both channels deleted after the end", timeout: .seconds(30)) {
            let production = try? await ingest.request("GET", path + "?environment=production", key: app.publicKey)
            let sandbox = try? await ingest.request("GET", path + "?environment=sandbox", key: app.publicKey)
            return production?.status == 404 && sandbox?.status == 404
        }
        let broadcasts = simulator.broadcasts()
        #expect(broadcasts.count == 4, "one broadcast per update and environment: \(broadcasts)")
        for id in [channelID, sandboxID] {
            let sent = broadcasts.filter { $0["channelId"]?.stringValue == id }
            #expect(sent.count == 2 && sent.allSatisfy { $0["expiration"]?.numberValue == 0 })
            #expect(sent.first?["payload"]?["aps"]?["event"]?.stringValue == "update")
            #expect(sent.first?["payload"]?["aps"]?["content-state"]?["step"]?.stringValue == "picked")
            #expect(sent.last?["payload"]?["aps"]?["event"]?.stringValue == "end")
        }
        let pushed = simulator.accepted().compactMap { $0["token"]?.stringValue }
        #expect(pushed.sorted() == (tokens + tokens).sorted(), "each registered token got the update and the end")

        // The post's channel is gone at APNs too: a new request makes a new one.
        let remade = try await ingest.request("POST", path, key: app.secretKey, json: #"{"environment": "production"}"#)
        #expect(remade.status == 201 && !remade.text.contains(channelID), "\(remade.text)")

        let refused = try await ingest.request("POST", "/v1/apps/\(other.id)/activities/\(post)/broadcast",
                                               key: other.secretKey, json: #"{"environment": "production"}"#)
        #expect(refused.status == 502 && refused.text.contains("FeatureNotEnabled"), "\(refused.text)")
        // The refusal is kept for the next request to read, but a post with no channel expires with it.
        let redis = RedisClient(configuration: try RedisConfiguration(url: try TestEnvironment.redisURL()))
        let left = try await redis.command(["TTL", RedisKeys(app: other.id).broadcast(post)]).int ?? -3
        #expect(left > 86_000 && left <= 86_400, "TTL \(left)")
        await redis.close()

        await stack.dispatcher.child.stop()
        await ingest.child.stop()
        await simulator.child.stop()
        cleanUp(directory, keep: false)
    }

    /// A final update whose broadcast APNs keeps failing (503 on every attempt) is dead-lettered, and its channel is
    /// kept: deleted, the replay of that "end" could never reach the devices that joined it. Registered tokens still
    /// get their end, and their registrations go.
    @Test("a final update whose broadcast is dead-lettered after every attempt keeps its channel for the replay")
    func aFailedFinalBroadcastKeepsItsChannel() async throws {
        let directory = try scratchDirectory("herald-broadcast-final-")
        let apps = try TestApps(count: 1)
        defer { apps.remove() }
        let topics = FaultTopics(brokers: try TestEnvironment.kafkaBrokers())
        let app = apps.apps[0]
        let stack = try await FaultStack.start(apps: apps, redisURL: try TestEnvironment.redisURL(), topics: topics,
                                               directory: directory, channelCount: 1, perChannel: 1)
        let (simulator, ingest) = (stack.simulator, stack.ingest)
        let post = SecureRandom.hex(8)
        let path = "/v1/apps/\(app.id)/activities/\(post)/broadcast"
        let created = try await ingest.request("POST", path, key: app.secretKey, json: #"{"environment": "production"}"#)
        try #require(created.status == 201, "\(created.text)")
        let channelID = try #require(JSONValue(parsing: Array(created.text.utf8))?["channelId"]?.stringValue)
        try simulator.setRules([.object(["channelId": .string(channelID), "status": .number(503),
                                         "reason": .string("ServiceUnavailable")])])
        try await Task.sleep(for: .milliseconds(500)) // the simulator reads its rules file again every 100 ms
        let end = try await ingest.request("POST", "/v1/apps/\(app.id)/activities/\(post)/events", key: app.secretKey,
                                           json: #"{"event": "end", "contentState": {"step": "delivered"}, "final": true}"#)
        try #require(end.status == 202, "\(end.text)")
        let reader = try await TopicReader(topic: topics.deadLetters, brokers: topics.brokers)
        var letters: [JSONValue] = []
        let deadline = ContinuousClock.now + .seconds(60)
        while letters.isEmpty, ContinuousClock.now < deadline {
            letters += try await reader.read(wait: .milliseconds(100)).compactMap { JSONValue(parsing: $0.value) }
            if letters.isEmpty { try await Task.sleep(for: .milliseconds(200)) }
        }
        await reader.close()
        #expect(letters.first?["disposition"]?.stringValue == "retries_exhausted", "\(letters)")
        #expect(letters.first?["channelId"]?.stringValue == channelID, "\(letters)")
        let statusPath = "/v1/apps/\(app.id)/jobs/" + (try #require(JSONValue(parsing: Array(end.text.utf8))?["jobId"]?.stringValue))
        try await eventually("the job finished", timeout: .seconds(30)) {
            let status = try await ingest.request("GET", statusPath, key: app.secretKey)
            return JSONValue(parsing: Array(status.text.utf8))?["state"]?.stringValue == "done"
        }
        let read = try await ingest.request("GET", path + "?environment=production", key: app.publicKey)
        #expect(read.status == 200 && read.text.contains(channelID), "the channel was deleted: \(read.text)")
        #expect(simulator.broadcasts().isEmpty)

        await stack.dispatcher.child.stop()
        await ingest.child.stop()
        await simulator.child.stop()
        cleanUp(directory, keep: false)
    }

    /// The janitor, every second with posts idle after 5 s: an idle post's channel is deleted while a busy one's
    /// stays, even behind a page of idle posts whose channels APNs refuses to delete; a channel APNs has but Redis lost is deleted at APNs once seen so twice; one Redis has but APNs
    /// lost is forgotten; the channel count at APNs is exported.
    @Test("the janitor deletes idle and orphaned channels, forgets vanished ones, and counts what APNs has")
    func janitorKeepsChannelsTidy() async throws {
        let directory = try scratchDirectory("herald-broadcast-janitor-")
        let apps = try TestApps(count: 1)
        defer { apps.remove() }
        let topics = FaultTopics(brokers: try TestEnvironment.kafkaBrokers())
        let app = apps.apps[0]
        let stack = try await FaultStack.start(apps: apps, redisURL: try TestEnvironment.redisURL(), topics: topics,
                                               directory: directory, channelCount: 1, perChannel: 1,
                                               dispatcherExtra: ["HERALD_BROADCAST_IDLE_SECONDS": "5",
                                                                 "HERALD_BROADCAST_JANITOR_INTERVAL_SECONDS": "1"])
        let (simulator, ingest, dispatcher) = (stack.simulator, stack.ingest, stack.dispatcher)
        let redis = RedisClient(configuration: try RedisConfiguration(url: try TestEnvironment.redisURL()))
        var configuration = APNsConfiguration()
        (configuration.manageProductionURL, configuration.extraCAFile) = (simulator.manageURL, simulator.caFile)
        let apns = try APNsClient(configuration: configuration, logger: faultLogger)
        let credentials = APNsCredentials(teamID: app.teamID, keyID: app.keyID, privateKey: app.apnsKey)
        @Sendable func atAPNs() async throws -> Set<String> {
            Set(try await apns.manage(.list(bundleID: app.bundleID), credentials: credentials, environment: .production)
                .channels ?? [])
        }
        func create(_ post: String) async throws -> String {
            let made = try await ingest.request("POST", "/v1/apps/\(app.id)/activities/\(post)/broadcast", key: app.secretKey,
                                                json: #"{"environment": "production"}"#)
            try #require(made.status == 201, "\(made.text)")
            return try #require(JSONValue(parsing: Array(made.text.utf8))?["channelId"]?.stringValue)
        }
        @Sendable func stored(_ post: String) async throws -> Bool {
            try await ingest.request("GET", "/v1/apps/\(app.id)/activities/\(post)/broadcast?environment=production",
                                     key: app.publicKey).status == 200
        }
        let (idle, busy, orphaned, vanished) = (SecureRandom.hex(8), SecureRandom.hex(8), SecureRandom.hex(8), SecureRandom.hex(8))
        _ = try await create(idle)
        let busyID = try await create(busy)
        let orphanID = try await create(orphaned), vanishedID = try await create(vanished)
        // Redis loses one (as a crash between create and save would), APNs the other (as the capability turned off).
        _ = try await redis.command(["DEL", RedisKeys(app: app.id).broadcast(orphaned)])
        let deleted = try await apns.manage(.delete(bundleID: app.bundleID, channelID: vanishedID), credentials: credentials,
                                            environment: .production)
        try #require(deleted.status == 204)
        // The busy post gets an update a second; each publish marks it in use.
        let updates = Task {
            while !Task.isCancelled {
                _ = try? await ingest.request("POST", "/v1/apps/\(app.id)/activities/\(busy)/events", key: app.secretKey,
                                              json: #"{"event": "update", "contentState": {"step": "on the way"}}"#)
                try? await Task.sleep(for: .seconds(1))
            }
        }
        try await eventually("the orphan deleted at APNs and the vanished channel forgotten", timeout: .seconds(20)) {
            let listed = (try? await atAPNs()) ?? []
            let forgotten = !((try? await stored(vanished)) ?? true)
            return !listed.contains(orphanID) && forgotten
        }
        #expect(try await stored(idle), "not idle yet")
        // Ahead of it in the idle index, a full page of posts whose channels APNs refuses to delete (ids it cannot
        // read): the janitor must still reach the idle post behind them.
        let store = BroadcastChannelStore(redis: redis)
        var backdated = ["ZADD", RedisKeys(app: app.id).broadcastIndex]
        for index in 0..<BroadcastChannelStore.pageSize {
            _ = try await store.save(app: app.id, postIDHash: "refused\(index)", BroadcastChannel(
                channelID: "refused-\(index)", environment: .production, storagePolicy: .noStorage,
                createdAt: "2026-01-01T00:00:00Z"))
            backdated += [String(index + 1), "refused\(index)"]
        }
        _ = try await redis.command(backdated)
        try await eventually("the idle post's channel deleted", timeout: .seconds(20)) {
            !((try? await stored(idle)) ?? true)
        }
        #expect(try await atAPNs() == [busyID], "only the busy post's channel is left at APNs")
        #expect(try await stored(busy))
        try await eventually("the count at APNs exported", timeout: .seconds(10)) {
            await dispatcher.metric("herald_broadcast_channels", labels: ["app": app.id, "environment": "production"]) == 1
        }
        for (action, count) in [("idle_deleted", 1.0), ("orphan_deleted", 1), ("forgotten", 1)] {
            #expect(await dispatcher.metric("herald_broadcast_janitor_channels_total", labels: ["action": action]) == count,
                    "\(action)")
        }
        #expect(simulator.broadcasts().allSatisfy { $0["channelId"]?.stringValue == busyID })
        #expect(!simulator.broadcasts().isEmpty)
        updates.cancel()
        _ = await updates.result

        await apns.shutdown()
        await redis.close()
        await dispatcher.child.stop()
        await ingest.child.stop()
        await simulator.child.stop()
        cleanUp(directory, keep: false)
    }

    /// Apple lists a bundle's channels: two apps of one bundle id see each other's channels there, and neither
    /// janitor takes the other's for orphans.
    @Test("two apps of one bundle id keep each other's channels")
    func appsSharingABundleKeepEachOthersChannels() async throws {
        let directory = try scratchDirectory("herald-broadcast-shared-")
        let apps = try TestApps(count: 2, bundleID: "com.example.shared" + SecureRandom.hex(3))
        defer { apps.remove() }
        let topics = FaultTopics(brokers: try TestEnvironment.kafkaBrokers())
        let stack = try await FaultStack.start(apps: apps, redisURL: try TestEnvironment.redisURL(), topics: topics,
                                               directory: directory, channelCount: 1, perChannel: 1,
                                               dispatcherExtra: ["HERALD_BROADCAST_JANITOR_INTERVAL_SECONDS": "1"])
        var made: [String] = []
        for app in apps.apps {
            let post = SecureRandom.hex(8)
            let response = try await stack.ingest.request("POST", "/v1/apps/\(app.id)/activities/\(post)/broadcast",
                                                          key: app.secretKey, json: #"{"environment": "production"}"#)
            try #require(response.status == 201, "\(response.text)")
            made.append(try #require(JSONValue(parsing: Array(response.text.utf8))?["channelId"]?.stringValue))
        }
        // An orphan is deleted once seen in two rounds an interval apart: give it four.
        try await Task.sleep(for: .seconds(5))
        var configuration = APNsConfiguration()
        (configuration.manageProductionURL, configuration.extraCAFile) = (stack.simulator.manageURL, stack.simulator.caFile)
        let apns = try APNsClient(configuration: configuration, logger: faultLogger)
        let app = apps.apps[0]
        let listed = try await apns.manage(.list(bundleID: app.bundleID), credentials: APNsCredentials(
            teamID: app.teamID, keyID: app.keyID, privateKey: app.apnsKey), environment: .production).channels ?? []
        #expect(Set(listed) == Set(made))
        #expect(await stack.dispatcher.metric("herald_broadcast_janitor_channels_total",
                                              labels: ["action": "orphan_deleted"]) ?? 0 == 0)
        await apns.shutdown()
        await stack.dispatcher.child.stop()
        await stack.ingest.child.stop()
        await stack.simulator.child.stop()
        cleanUp(directory, keep: false)
    }

    /// A channel made at APNs whose save never happened (a crash, a lost answer), in an environment where Redis
    /// knows no channel at all: the janitor still lists that environment, and deletes the orphan.
    @Test("an orphan in an environment with no channel left in Redis is deleted")
    func anOrphanAloneInItsEnvironmentIsDeleted() async throws {
        let directory = try scratchDirectory("herald-broadcast-lone-orphan-")
        let apps = try TestApps(count: 1)
        defer { apps.remove() }
        let app = apps.apps[0]
        let topics = FaultTopics(brokers: try TestEnvironment.kafkaBrokers())
        let stack = try await FaultStack.start(apps: apps, redisURL: try TestEnvironment.redisURL(), topics: topics,
                                               directory: directory, channelCount: 1, perChannel: 1,
                                               dispatcherExtra: ["HERALD_BROADCAST_JANITOR_INTERVAL_SECONDS": "1"])
        let post = SecureRandom.hex(8)
        let made = try await stack.ingest.request("POST", "/v1/apps/\(app.id)/activities/\(post)/broadcast",
                                                  key: app.secretKey, json: #"{"environment": "production"}"#)
        try #require(made.status == 201, "\(made.text)")
        let orphan = try #require(JSONValue(parsing: Array(made.text.utf8))?["channelId"]?.stringValue)
        // Redis loses the post's only channel, as if the save after Apple's answer never happened; a dispatcher
        // started then has never seen a channel in that environment.
        await stack.dispatcher.child.stop()
        let redis = RedisClient(configuration: try RedisConfiguration(url: try TestEnvironment.redisURL()))
        _ = try await redis.command(["DEL", RedisKeys(app: app.id).broadcast(post)])
        _ = try await redis.command(["ZREM", RedisKeys(app: app.id).broadcastIndex, post])
        let dispatcher = try DispatcherProcess(apps: apps, simulator: stack.simulator, topics: topics,
                                               redisURL: try TestEnvironment.redisURL(), directory: directory,
                                               name: "dispatcher-after",
                                               extra: ["HERALD_BROADCAST_JANITOR_INTERVAL_SECONDS": "1"])
        try await dispatcher.waitForAssignment()
        var configuration = APNsConfiguration()
        (configuration.manageProductionURL, configuration.extraCAFile) = (stack.simulator.manageURL, stack.simulator.caFile)
        let apns = try APNsClient(configuration: configuration, logger: faultLogger)
        let credentials = APNsCredentials(teamID: app.teamID, keyID: app.keyID, privateKey: app.apnsKey)
        try await eventually("the orphan deleted at APNs", timeout: .seconds(20)) {
            let listed = try? await apns.manage(.list(bundleID: app.bundleID), credentials: credentials,
                                                environment: .production).channels
            return listed.map { !$0.contains(orphan) } ?? false
        }
        #expect(await dispatcher.metric("herald_broadcast_janitor_channels_total",
                                        labels: ["action": "orphan_deleted"]) == 1)
        await apns.shutdown()
        await redis.close()
        await dispatcher.child.stop()
        await stack.ingest.child.stop()
        await stack.simulator.child.stop()
        cleanUp(directory, keep: false)
    }
}
