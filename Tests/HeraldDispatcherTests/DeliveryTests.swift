import Foundation
import HeraldAPNsSimulator
import HeraldCore
import HeraldCrypto
@testable import HeraldDispatcher
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldStore
import HeraldTestSupport
import Testing

/// The dispatcher in-process against real Redis, Tansu and two APNs simulators (production and sandbox).
@Suite("Dispatcher delivery", .serialized)
struct DeliveryTests {
    @Test("a channel event reaches alert, Live Activity update and push-to-start subscribers, each on its host")
    func channelEvent() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[0]
        let channel = "order:\(SecureRandom.hex(4)):status"
        let alertProduction = deviceToken(), alertSandbox = deviceToken(), activity = deviceToken()
        let otherActivity = deviceToken(), starter = deviceToken()
        try await harness.subscribe(app, channel: channel, token: alertProduction)
        try await harness.subscribe(app, channel: channel, token: alertSandbox, environment: .sandbox)
        try await harness.subscribe(app, channel: channel, token: activity, type: .liveActivityUpdate, activityID: "act-1")
        try await harness.subscribe(app, channel: channel, token: otherActivity, type: .liveActivityUpdate,
                                    activityID: "act-2")
        try await harness.subscribe(app, channel: channel, token: starter, type: .liveActivityStart)

        var job = PushJob(id: "job-\(SecureRandom.hex(4))", appId: app.id, target: .channel(channel))
        job.alert = .object(["aps": .object(["alert": .object(["title": .string("Order shipped")])]),
                             "orderId": .string("42")])
        job.liveActivity = PushJob.LiveActivity(event: .update, contentState: .object(["status": .string("shipped")]),
                                                staleDate: 1_900_000_000, activityID: "act-1")
        job.start = PushJob.Start(attributesType: "OrderAttributes", attributes: .object(["orderId": .string("42")]),
                                  contentState: .object(["status": .string("shipped")]),
                                  alert: .object(["title": .string("Tracking")]))
        job.collapseId = "order-42"
        let before = Date().timeIntervalSince1970.rounded(.down)
        try await harness.produce(job)

        try await eventually("production received 3 pushes and sandbox 1") {
            harness.simulators.accepted().count >= 3 && harness.simulators.accepted(sandbox: true).count >= 1
        }
        try await Task.sleep(for: .milliseconds(300))
        let production = harness.simulators.accepted()
        let sandbox = harness.simulators.accepted(sandbox: true)
        #expect(production.count == 3)
        #expect(sandbox.count == 1)
        func find(_ records: [JSONValue], _ token: String) -> JSONValue? { records.first { $0["token"]?.stringValue == token } }

        let alert = try #require(find(production, alertProduction))
        #expect(alert["topic"]?.stringValue == app.bundleID)
        #expect(alert["pushType"]?.stringValue == "alert")
        #expect(alert["priority"]?.numberValue == 10)
        #expect(alert["collapseId"]?.stringValue == "order-42")
        #expect(alert["payload"] == job.alert)
        #expect(find(sandbox, alertSandbox)?["payload"] == job.alert)

        let update = try #require(find(production, activity))
        #expect(update["topic"]?.stringValue == app.bundleID + ".push-type.liveactivity")
        #expect(update["pushType"]?.stringValue == "liveactivity")
        #expect(update[path: "payload", "aps", "event"]?.stringValue == "update")
        #expect(update[path: "payload", "aps", "content-state", "status"]?.stringValue == "shipped")
        #expect(update[path: "payload", "aps", "stale-date"]?.numberValue == 1_900_000_000)
        let timestamp = try #require(update[path: "payload", "aps", "timestamp"]?.numberValue)
        #expect(timestamp >= before && timestamp <= Date().timeIntervalSince1970 + 1)
        #expect(find(production, otherActivity) == nil, "another activity's token got the update")

        let start = try #require(find(production, starter))
        #expect(start["topic"]?.stringValue == app.bundleID + ".push-type.liveactivity")
        #expect(start[path: "payload", "aps", "event"]?.stringValue == "start")
        #expect(start[path: "payload", "aps", "attributes-type"]?.stringValue == "OrderAttributes")
        #expect(start[path: "payload", "aps", "alert", "title"]?.stringValue == "Tracking")
        #expect(start[path: "payload", "aps", "timestamp"]?.numberValue != nil)

        #expect(harness.metric("herald_dispatcher_pushes_total", labels: ["push_type": "liveactivity", "status": "200"]) == 2)
        #expect(harness.metric("herald_dispatcher_end_to_end_seconds_count") == 4)
        await harness.stop()
    }

    @Test("an alert that only wakes the app (content-available alone) goes as a background push at priority 5, from a channel and to a device")
    func backgroundOnlyAlerts() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[0]
        let channel = "sync:\(SecureRandom.hex(4))"
        let subscriber = deviceToken(), device = deviceToken(), insisted = deviceToken()
        try await harness.subscribe(app, channel: channel, token: subscriber)
        let silent: JSONValue = .object(["aps": .object(["content-available": .number(1)]), "sync": .string("inbox")])
        var job = PushJob(id: "silent-\(SecureRandom.hex(4))", appId: app.id, target: .channel(channel))
        job.alert = silent
        try await harness.produce(job)
        var direct = PushJob(id: "silent-\(SecureRandom.hex(4))", appId: app.id,
                             target: .device(device, tokenType: .alert, environment: nil))
        direct.payload = silent
        try await harness.produce(direct)
        // Its producer's own push type is kept, at priority 5 all the same.
        var asAlert = PushJob(id: "silent-\(SecureRandom.hex(4))", appId: app.id,
                              target: .device(insisted, tokenType: .alert, environment: nil))
        asAlert.payload = silent
        asAlert.pushType = "alert"
        try await harness.produce(asAlert)

        try await eventually("all three were delivered") { harness.simulators.accepted().count >= 3 }
        for token in [subscriber, device, insisted] {
            let record = try #require(harness.simulators.accepted().first { $0["token"]?.stringValue == token })
            #expect(record["pushType"]?.stringValue == (token == insisted ? "alert" : "background"))
            #expect(record["priority"]?.numberValue == 5)
            #expect(record["topic"]?.stringValue == app.bundleID)
            #expect(record["payload"] == silent)
        }
        await harness.stop()
    }

    @Test("a fan-out of many small batches, read ahead and saved in the background, reaches every subscriber once and leaves only the record that it is done")
    func manySmallBatches() async throws {
        // Tiny batches, window and limit: dozens of reads, saves and launches, each limit reached many times.
        let harness = try await DispatcherHarness.start { configuration in
            configuration.batchSize = 7
            configuration.maxBatchesInFlightPerJob = 2
            configuration.maxInFlightPushes = 5
        }
        let app = harness.apps.apps[0]
        let channel = "news:\(SecureRandom.hex(4))"
        let tokens = (0..<300).map { _ in deviceToken() }
        for (index, token) in tokens.enumerated() {
            try await harness.subscribe(app, channel: channel, token: token, environment: index % 5 == 0 ? .sandbox : .production)
        }
        var job = PushJob(id: "many-\(SecureRandom.hex(4))", appId: app.id, target: .channel(channel))
        job.alert = .object(["aps": .object(["alert": .string("read ahead")])])
        try await harness.produce(job)

        try await eventually("every subscriber got the push", timeout: .seconds(60)) {
            harness.simulators.accepted().count + harness.simulators.accepted(sandbox: true).count >= tokens.count
        }
        try await eventually("the job completed") { harness.metric("herald_dispatcher_jobs_completed_total") == 1 }
        try await Task.sleep(for: .milliseconds(300))
        let received = (harness.simulators.accepted() + harness.simulators.accepted(sandbox: true))
            .compactMap { $0["token"]?.stringValue }
        #expect(received.count == tokens.count, "\(received.count - tokens.count) duplicates")
        #expect(Set(received) == Set(tokens))
        // A save still running when the last batch settled must not land after the record that it is done.
        let keys = try await harness.redis.command(["KEYS", "herald:{\(app.id)}:fanout:\(harness.topics.group):*"]).strings ?? []
        #expect(keys.count == 1, "one progress record per job: \(keys)")
        for key in keys {
            let fields = try await harness.redis.command(["HGETALL", key]).strings
            #expect(fields == ["done", "1"], "the settled job's record holds only that it is done")
        }
        let status = try #require(try await JobStatusStore(redis: harness.redis).read(app: app.id, jobID: job.id))
        #expect(status.state == .done && status.counts.delivered == tokens.count && status.counts.retried == 0, "\(status)")
        await harness.stop()
    }

    @Test("a post's update then end: Live Activity pushes on each registration's bundle, then no registrations left")
    func postUpdateThenEnd() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[0]
        let post = postHash()
        let phone = deviceToken(), widget = deviceToken(), sandboxed = deviceToken()
        try await harness.register(app, post: post, token: phone)
        try await harness.register(app, post: post, token: widget, bundleID: app.bundleID + ".widget")
        try await harness.register(app, post: post, token: sandboxed, environment: .sandbox)

        var update = PushJob(id: "upd-\(SecureRandom.hex(4))", appId: app.id, target: .post(post))
        update.liveActivity = PushJob.LiveActivity(event: .update, contentState: .object(["score": .string("1-0")]))
        try await harness.produce(update)
        var end = PushJob(id: "end-\(SecureRandom.hex(4))", appId: app.id, target: .post(post))
        end.liveActivity = PushJob.LiveActivity(event: .end, contentState: .object(["score": .string("2-1")]),
                                                dismissalDate: 1_900_000_000)
        try await harness.produce(end)

        try await eventually("4 production and 2 sandbox pushes arrived") {
            harness.simulators.accepted().count >= 4 && harness.simulators.accepted(sandbox: true).count >= 2
        }
        let production = harness.simulators.accepted()
        #expect(production.allSatisfy { $0["pushType"]?.stringValue == "liveactivity" })
        let events = production.filter { $0["token"]?.stringValue == phone }.compactMap { $0[path: "payload", "aps", "event"]?.stringValue }
        #expect(events == ["update", "end"], "one target's jobs arrive in order")
        let widgetTopics = Set(production.filter { $0["token"]?.stringValue == widget }.compactMap { $0["topic"]?.stringValue })
        #expect(widgetTopics == [app.bundleID + ".widget.push-type.liveactivity"])
        let sandbox = harness.simulators.accepted(sandbox: true)
        #expect(sandbox.allSatisfy { $0["token"]?.stringValue == sandboxed })
        #expect(sandbox.last?[path: "payload", "aps", "dismissal-date"]?.numberValue == 1_900_000_000)

        try await eventually("the post has no registrations left") {
            let left = try await harness.activities.postBatch(app: app.id, postIDHash: post, cursor: "0").registrations
            let index = try await harness.redis.command(["EXISTS", RedisKeys(app: app.id).post(post)]).int
            return left.isEmpty && index == 0
        }
        await harness.stop()
    }

    @Test("a post update's record run again (its offset not yet committed) does not publish its broadcast again")
    func aPostsBroadcastGoesOnceWhenItsRecordRunsAgain() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[0]
        let post = postHash()
        try await harness.produce(try EventIntake.broadcastChannel(.object(["environment": .string("production")]),
                                                                   appID: app.id, postIDHash: post))
        let channels = BroadcastChannelStore(redis: harness.redis)
        try await eventually("the post's channel was made") {
            if case .ready = try await channels.state(app: app.id, postIDHash: post, environment: .production) { return true }
            return false
        }
        let phone = deviceToken()
        try await harness.register(app, post: post, token: phone)
        var update = PushJob(id: "upd-\(SecureRandom.hex(4))", appId: app.id, target: .post(post))
        update.liveActivity = PushJob.LiveActivity(event: .update, contentState: .object(["score": .string("1-0")]))
        try await harness.produce(update)
        try await eventually("the update broadcast and pushed") {
            harness.simulators.broadcasts().count == 1 && harness.simulators.accepted().count == 1
        }
        let record = try #require(try await readTopic(harness.topics.jobs, brokers: harness.topics.brokers, expecting: 2,
                                                      timeout: .seconds(20)).last)
        // The job keeps no marks of its pushes: its broadcast's mark is kept an hour after it settled, not a day.
        let progress = RedisKeys(app: app.id).fanOut(group: harness.topics.group, topic: record.topic,
                                                    partition: record.partition, offset: record.offset, job: update.id)
        try await eventually("the settled job's broadcast mark kept an hour") {
            (1...3_600).contains(try await harness.redis.command(["TTL", progress]).int ?? 0)
        }
        #expect(await harness.service.runner.run(record))
        // Nor the one token's push: a job this small keeps no marks of its pushes, but its status names the record
        // that finished it.
        #expect(harness.simulators.accepted().count == 1)
        #expect(harness.simulators.broadcasts().count == 1, "\(harness.simulators.broadcasts())")
        let status = try #require(try await JobStatusStore(redis: harness.redis).read(app: app.id, jobID: update.id))
        #expect(status.counts.broadcasts == 1 && status.counts.delivered == 1 && status.counts.broadcastsDeadLettered == 0,
                "\(status.counts)")
        // The same job produced again (a new record, as after fixing what dead-lettered it) runs.
        try await harness.produce(update)
        try await eventually("the job produced again went") {
            harness.simulators.broadcasts().count == 2 && harness.simulators.accepted().count == 2
        }
        await harness.stop()
    }

    /// The post's production channel, made through the dispatcher, whose broadcasts the simulator then answers with
    /// `status` and `reason`.
    private func madeChannel(_ harness: DispatcherHarness, app: TestApps.Entry, post: String, answered status: Int,
                             _ reason: String) async throws -> BroadcastChannel {
        try await harness.produce(try EventIntake.broadcastChannel(.object(["environment": .string("production")]),
                                                                   appID: app.id, postIDHash: post))
        let channels = BroadcastChannelStore(redis: harness.redis)
        try await eventually("the post's channel was made") {
            try await !channels.channels(app: app.id, postIDHash: post).isEmpty
        }
        let channel = try #require(try await channels.channels(app: app.id, postIDHash: post).first)
        try harness.simulators.production.setRules([SimulatorRule(channelID: channel.channelID, status: status, reason: reason)])
        return channel
    }

    /// A final update whose broadcast fails every attempt keeps its channel for the replay, also when its record runs
    /// again after it finished (a rebalance before the commit): that run must not delete what the first one kept.
    @Test("a final update's channel kept for the replay stays when the record runs again")
    func aKeptChannelStaysWhenTheFinalRecordRunsAgain() async throws {
        let harness = try await DispatcherHarness.start(maxAttempts: 2)
        let app = harness.apps.apps[0]
        let post = postHash()
        let channels = BroadcastChannelStore(redis: harness.redis)
        let channel = try await madeChannel(harness, app: app, post: post, answered: 503, "ServiceUnavailable")
        var end = PushJob(id: "end-\(SecureRandom.hex(4))", appId: app.id, target: .post(post))
        end.liveActivity = PushJob.LiveActivity(event: .end, contentState: .object(["score": .string("2-1")]))
        end.final = true
        try await harness.produce(end)
        let letters = try await harness.deadLetters(expecting: 1)
        #expect(letters.first?["disposition"]?.stringValue == "retries_exhausted")
        try await eventually("the job is settled") { harness.metric("herald_dispatcher_jobs_completed_total") == 2 }
        #expect(try await channels.channels(app: app.id, postIDHash: post).map(\.channelID) == [channel.channelID])
        let record = try #require(try await readTopic(harness.topics.jobs, brokers: harness.topics.brokers, expecting: 2,
                                                      timeout: .seconds(20)).last)
        #expect(await harness.service.runner.run(record))
        #expect(try await channels.channels(app: app.id, postIDHash: post).map(\.channelID) == [channel.channelID],
                "the run again deleted the channel kept for the replay")
        await harness.stop()
    }

    /// Turning an app's Broadcast capability off deletes all its channels, and APNs then answers FeatureNotEnabled
    /// (never ChannelNotRegistered): the channel is forgotten, so devices are no longer handed a dead one and the
    /// post's next channel request asks APNs for a new one.
    @Test("a broadcast answered FeatureNotEnabled forgets the channel")
    func aChannelOfADisabledCapabilityIsForgotten() async throws {
        let harness = try await DispatcherHarness.start(maxAttempts: 2)
        let app = harness.apps.apps[0]
        let post = postHash()
        let channels = BroadcastChannelStore(redis: harness.redis)
        _ = try await madeChannel(harness, app: app, post: post, answered: 400, "FeatureNotEnabled")
        var update = PushJob(id: "upd-\(SecureRandom.hex(4))", appId: app.id, target: .post(post))
        update.liveActivity = PushJob.LiveActivity(event: .update, contentState: .object(["score": .string("1-0")]))
        try await harness.produce(update)
        let letters = try await harness.deadLetters(expecting: 1)
        #expect(letters.first?["reason"]?.stringValue == "FeatureNotEnabled", "\(letters)")
        try await eventually("the channel forgotten") { try await channels.channels(app: app.id, postIDHash: post).isEmpty }
        let updateID = update.id
        try await eventually("the job's status counts the broadcast dead-lettered") {
            try await JobStatusStore(redis: harness.redis).read(app: app.id, jobID: updateID)?.counts.broadcastsDeadLettered == 1
        }
        await harness.stop()
    }

    /// A topic deleted and created again starts its offsets over: another job's finished fan-out at the same
    /// partition and offset (its `done` mark kept an hour) must not make this one look settled.
    @Test("a fan-out at an offset where another job's fan-out finished (a topic created again) still runs")
    func anotherJobsProgressAtTheSameOffsetIsNotResumed() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[0]
        let channel = "again-\(SecureRandom.hex(4))"
        let tokens = (0..<150).map { _ in deviceToken() }
        for token in tokens { try await harness.subscribe(app, channel: channel, token: token) }
        let earlier = RedisKeys(app: app.id).fanOut(group: harness.topics.group, topic: harness.topics.jobs, partition: 0,
                                                    offset: 0, job: "earlier-job")
        try await harness.redis.command(["HSET", earlier, "done", "1"])
        try await harness.redis.command(["EXPIRE", earlier, "3600"])
        var job = PushJob(id: "later-\(SecureRandom.hex(4))", appId: app.id, target: .channel(channel))
        job.alert = .object(["aps": .object(["alert": .string("hello")])])
        try await harness.produce(job, partition: 0)
        try await eventually("every subscriber got the push") { harness.simulators.accepted().count == tokens.count }
        #expect(try await harness.redis.command(["HGET", earlier, "done"]).string == "1", "the other job's mark is its own")
        await harness.stop()
    }

    @Test("410 removes the token's subscriptions, except those renewed after the 410's timestamp")
    func unregisteredTokenIsRemoved() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[0]
        let channel = "news-\(SecureRandom.hex(4))"
        let gone = deviceToken("dead01"), renewed = deviceToken("dead02"), healthy = deviceToken()
        try await harness.subscribe(app, channel: channel, token: gone)
        try await harness.subscribe(app, channel: "other-\(channel)", token: gone)
        try await harness.subscribe(app, channel: channel, token: renewed)
        try await harness.subscribe(app, channel: channel, token: healthy)
        // `gone` became invalid now; `renewed` was invalid an hour ago but subscribed again since.
        try harness.simulators.production.setRules([
            .fail(tokenPrefix: "dead01", status: 410, reason: "Unregistered"),
            .fail(tokenPrefix: "dead02", status: 410, reason: "Unregistered",
                  timestamp: Int64(Date().timeIntervalSince1970 * 1000) - 3_600_000),
        ])
        var job = PushJob(id: "j-\(SecureRandom.hex(4))", appId: app.id, target: .channel(channel))
        job.alert = .object(["aps": .object(["alert": .string("hello")])])
        try await harness.produce(job)

        try await eventually("the dead token's subscriptions are gone") {
            try await harness.subscriptions.list(app: app.id, deviceToken: gone).subscriptions.isEmpty
        }
        try await eventually("the job is settled") { harness.metric("herald_dispatcher_jobs_completed_total") == 1 }
        #expect(try await harness.subscriptions.list(app: app.id, deviceToken: renewed).subscriptions.count == 1)
        #expect(try await harness.subscriptions.list(app: app.id, deviceToken: healthy).subscriptions.count == 1)
        #expect(harness.simulators.accepted().map { $0["token"]?.stringValue } == [healthy])
        #expect(harness.metric("herald_dispatcher_tokens_removed_total", labels: ["kind": "subscription"]) == 2)
        #expect(harness.metric("herald_dispatcher_dead_letters_total") == nil)
        await harness.stop()
    }

    @Test("400 BadDeviceToken removes the token's subscriptions made before the push went, not one renewed while it was answered")
    func badTokenKeepsWhatWasRenewedAfterThePushWent() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[0]
        let channel = "news-\(SecureRandom.hex(4))"
        let bad = deviceToken("bad03")
        try await harness.subscribe(app, channel: channel, token: bad)
        try await harness.subscribe(app, channel: "other-\(channel)", token: bad)
        try harness.simulators.production.setRules([
            SimulatorRule(tokenPrefix: "bad03", status: 400, reason: "BadDeviceToken", delayMilliseconds: 1500),
        ])
        var job = PushJob(id: "d-\(SecureRandom.hex(4))", appId: app.id,
                          target: .device(bad, tokenType: .alert, environment: .production))
        job.payload = .object(["aps": .object(["alert": .string("hello")])])
        try await harness.produce(job)
        try await eventually("the push is waiting for its answer") {
            harness.metric("herald_dispatcher_in_flight_pushes") == 1
        }
        // The device subscribes again while APNs has not answered yet.
        try await Task.sleep(for: .milliseconds(20))
        try await harness.subscribe(app, channel: channel, token: bad)
        try await eventually("the job is settled") { harness.metric("herald_dispatcher_jobs_completed_total") == 1 }
        let left = try await harness.subscriptions.list(app: app.id, deviceToken: bad).subscriptions
        #expect(left.map(\.channel) == [channel])
        #expect(harness.metric("herald_dispatcher_tokens_removed_total", labels: ["kind": "subscription"]) == 1)
        await harness.stop()
    }

    /// A sibling app's bundle id in the apps file makes APNs refuse every token as not for the topic. The first 50
    /// refusals in a row remove their tokens as usual; the rest are dead-lettered and their tokens kept, until a push
    /// to that topic is delivered again, after which a refusal removes its token once more.
    @Test("after 50 token refusals in a row for one topic, removals are withheld (pushes dead-lettered, tokens kept) until a push there is delivered")
    func aRunOfRefusalsForOneTopicKeepsTheTokens() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[0]
        let channel = "news-\(SecureRandom.hex(4))"
        let tokens = (0..<117).map { _ in deviceToken() }
        for token in tokens { try await harness.subscribe(app, channel: channel, token: token) }
        try harness.simulators.production.setRules([.fail(tokenPrefix: nil, status: 400, reason: "DeviceTokenNotForTopic")])
        var job = PushJob(id: "t-\(SecureRandom.hex(4))", appId: app.id, target: .channel(channel))
        job.alert = .object(["aps": .object(["alert": .string("hello")])])
        try await harness.produce(job)
        try await eventually("the job is settled") { harness.metric("herald_dispatcher_jobs_completed_total") == 1 }
        #expect(harness.metric("herald_dispatcher_tokens_removed_total", labels: ["kind": "subscription"]) == 50)
        #expect(harness.metric("herald_dispatcher_token_removals_withheld_total") == 67)
        let letters = try await harness.deadLetters(expecting: 67)
        #expect(letters.count == 67 && letters.allSatisfy { $0["reason"]?.stringValue == "DeviceTokenNotForTopic" })
        var kept: [String] = []
        for token in tokens where !(try await harness.subscriptions.list(app: app.id, deviceToken: token).subscriptions.isEmpty) {
            kept.append(token)
        }
        #expect(kept.count == 67)

        // Fixed: pushes there are delivered again, and a token refused among them (one batch) is removed.
        let refused = (0..<3).map { _ in deviceToken("d0dd") }
        for token in refused { try await harness.subscribe(app, channel: channel, token: token) }
        try harness.simulators.production.setRules([.fail(tokenPrefix: "d0dd", status: 400, reason: "DeviceTokenNotForTopic")])
        job.id = "t-\(SecureRandom.hex(4))"
        try await harness.produce(job)
        try await eventually("the second job is settled") { harness.metric("herald_dispatcher_jobs_completed_total") == 2 }
        #expect(Set(harness.simulators.accepted().compactMap { $0["token"]?.stringValue }) == Set(kept))
        #expect(harness.metric("herald_dispatcher_tokens_removed_total", labels: ["kind": "subscription"]) == 53)
        #expect(harness.metric("herald_dispatcher_token_removals_withheld_total") == 67)
        for token in refused { #expect(try await harness.subscriptions.list(app: app.id, deviceToken: token).subscriptions.isEmpty) }
        await harness.stop()
    }

    @Test("a token failing with 503 twice is delivered on the third attempt; one failing always is dead-lettered")
    func retries() async throws {
        let harness = try await DispatcherHarness.start(maxAttempts: 3)
        let app = harness.apps.apps[0]
        let flaky = deviceToken("f1a0"), broken = deviceToken("b0b0")
        try harness.simulators.production.setRules([
            .fail(tokenPrefix: "f1a0", status: 503, reason: "ServiceUnavailable", times: 2),
            .fail(tokenPrefix: "b0b0", status: 500, reason: "InternalServerError"),
        ])
        for token in [flaky, broken] {
            var job = PushJob(id: "d-\(SecureRandom.hex(4))", appId: app.id,
                              target: .device(token, tokenType: .alert, environment: .production))
            job.payload = .object(["aps": .object(["alert": .string("retry me")])])
            try await harness.produce(job)
        }
        try await eventually("the flaky token got its push") {
            harness.simulators.accepted().contains { $0["token"]?.stringValue == flaky }
        }
        let letters = try await harness.deadLetters(expecting: 1)
        #expect(letters.count == 1)
        let letter = try #require(letters.first)
        #expect(letter["disposition"]?.stringValue == "retries_exhausted")
        #expect(letter["deviceToken"]?.stringValue == broken)
        #expect(letter["status"]?.numberValue == 500)
        #expect(letter["reason"]?.stringValue == "InternalServerError")
        #expect(letter["attempts"]?.numberValue == 3)
        #expect(harness.simulators.accepted().filter { $0["token"]?.stringValue == flaky }.count == 1)
        #expect(harness.metric("herald_dispatcher_retries_total", labels: ["reason": "ServiceUnavailable"]) == 2)
        #expect(harness.metric("herald_dispatcher_retries_total", labels: ["reason": "InternalServerError"]) == 2)
        await harness.stop()
    }

    @Test("in a channel fan-out (first attempts sent as one batch) a flaky token is retried to delivery and a broken one dead-lettered after every attempt")
    func channelRetries() async throws {
        let harness = try await DispatcherHarness.start(maxAttempts: 3)
        let app = harness.apps.apps[0]
        let channel = "retry-\(SecureRandom.hex(4))"
        let flaky = deviceToken("f1a1"), broken = deviceToken("b0b1"), healthy = [deviceToken(), deviceToken()]
        for token in [flaky, broken] + healthy { try await harness.subscribe(app, channel: channel, token: token) }
        try harness.simulators.production.setRules([
            .fail(tokenPrefix: "f1a1", status: 503, reason: "ServiceUnavailable", times: 2),
            .fail(tokenPrefix: "b0b1", status: 500, reason: "InternalServerError"),
        ])
        var job = PushJob(id: "c-\(SecureRandom.hex(4))", appId: app.id, target: .channel(channel))
        job.alert = .object(["aps": .object(["alert": .string("retry me")])])
        try await harness.produce(job)
        let letters = try await harness.deadLetters(expecting: 1)
        try await eventually("the flaky token got its push") {
            harness.simulators.accepted().contains { $0["token"]?.stringValue == flaky }
        }
        let letter = try #require(letters.first)
        #expect(letters.count == 1)
        #expect(letter["disposition"]?.stringValue == "retries_exhausted")
        #expect(letter["deviceToken"]?.stringValue == broken)
        #expect(letter["attempts"]?.numberValue == 3)
        let accepted = harness.simulators.accepted().compactMap { $0["token"]?.stringValue }
        #expect(accepted.filter { $0 == flaky }.count == 1)
        #expect(healthy.allSatisfy { token in accepted.filter { $0 == token }.count == 1 })
        #expect(harness.metric("herald_dispatcher_retries_total", labels: ["reason": "ServiceUnavailable"]) == 2)
        #expect(harness.metric("herald_dispatcher_retries_total", labels: ["reason": "InternalServerError"]) == 2)
        try await eventually("the job completed") { harness.metric("herald_dispatcher_jobs_completed_total") == 1 }
        await harness.stop()
    }

    @Test("a permanent failure gives exactly one dead letter with every replay fact, valid against its schema")
    func permanentFailure() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[0]
        let channel = "perm-\(SecureRandom.hex(4))"
        let token = deviceToken("bad0")
        try await harness.subscribe(app, channel: channel, token: token, type: .liveActivityUpdate, environment: .sandbox,
                                    activityID: "a1")
        try harness.simulators.sandbox.setRules([.fail(tokenPrefix: "bad0", status: 400, reason: "BadTopic")])
        var job = PushJob(id: "perm-\(SecureRandom.hex(4))", appId: app.id, target: .channel(channel))
        job.liveActivity = PushJob.LiveActivity(event: .update, contentState: .object(["n": .number(1)]))
        job.priority = 5
        try await harness.produce(job)

        let letters = try await harness.deadLetters(expecting: 1)
        #expect(letters.count == 1)
        let letter = try #require(letters.first)
        #expect(letter["disposition"]?.stringValue == "rejected")
        #expect(letter["status"]?.numberValue == 400)
        #expect(letter["reason"]?.stringValue == "BadTopic")
        #expect(letter["apnsUniqueId"]?.stringValue.flatMap(UUID.init(uuidString:)) != nil, "the answer's apns-unique-id is kept")
        #expect(harness.metric("herald_dispatcher_dead_letters_total", labels: ["reason": "BadTopic", "disposition": "rejected"]) == 1)
        #expect(letter["attempts"]?.numberValue == 1)
        #expect(letter["deviceToken"]?.stringValue == token)
        #expect(letter["tokenType"]?.stringValue == "liveactivity-update")
        #expect(letter["environment"]?.stringValue == "sandbox")
        #expect(letter["topic"]?.stringValue == app.bundleID + ".push-type.liveactivity")
        #expect(letter["pushType"]?.stringValue == "liveactivity")
        #expect(letter["priority"]?.numberValue == 5)
        #expect(letter[path: "payload", "aps", "event"]?.stringValue == "update")
        #expect(letter[path: "payload", "aps", "timestamp"]?.numberValue != nil)
        #expect(letter[path: "job", "id"]?.stringValue == job.id)
        #expect(letter[path: "job", "target", "channel"]?.stringValue == channel)
        #expect(letter["appId"]?.stringValue == app.id)
        #expect(letter["firstAttemptAt"]?.stringValue != nil && letter["lastAttemptAt"]?.stringValue != nil)
        try validateAgainstSchema([letter.encoded()], schema: "dead-letter.schema.json")
        let records = try await readTopic(harness.topics.deadLetters, brokers: harness.topics.brokers, expecting: 1,
                                          timeout: .seconds(5))
        #expect(records.first.map { String(decoding: $0.key ?? [], as: UTF8.self) } == "\(app.id)/device/\(SHA256.hex(token))")
        await harness.stop()
    }

    @Test("invalid jobs are dead-lettered as invalid_job and the next valid job is still delivered")
    func invalidJobs() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[0]
        let token = deviceToken()
        let key = "\(app.id)/device/\(token)"
        try await harness.produce(raw: "this is not json", key: key)
        try await harness.produce(raw: #"{"version": 1, "id": "x", "appId": "\#(app.id)", "createdAt": "2024-01-01T00:00:00.000Z", "target": {"kind": "channel", "channel": "c"}}"#, key: key)
        var unknown = PushJob(id: "u-1", appId: "no-such-app", target: .device(token, tokenType: .alert, environment: .production))
        unknown.payload = .object(["aps": .object(["alert": .string("x")])])
        try await harness.produce(raw: String(decoding: unknown.encoded(), as: UTF8.self), key: key)
        var valid = PushJob(id: "v-1", appId: app.id, target: .device(token, tokenType: .alert, environment: .production))
        valid.payload = .object(["aps": .object(["alert": .string("still here")])])
        try await harness.produce(valid)

        try await eventually("the valid job was delivered") {
            harness.simulators.accepted().contains { $0["token"]?.stringValue == token }
        }
        let letters = try await harness.deadLetters(expecting: 3)
        #expect(letters.count == 3)
        #expect(letters.allSatisfy { $0["reason"]?.stringValue == "invalid_job" && $0["disposition"]?.stringValue == "invalid_job" })
        #expect(letters.allSatisfy { $0["job"] == nil && !($0["message"]?.stringValue ?? "").isEmpty })
        #expect(letters.first?["rawJob"]?.stringValue == "this is not json")
        #expect(letters.dropFirst().first?["message"]?.stringValue?.contains("alert, liveActivity or start") == true)
        #expect(letters.last?["appId"]?.stringValue == "no-such-app")
        #expect(letters.last?["message"]?.stringValue?.contains("no-such-app") == true)
        try validateAgainstSchema(letters.map { $0.encoded() }, schema: "dead-letter.schema.json")
        #expect(harness.metric("herald_dispatcher_jobs_invalid_total") == 3)
        // The invalid job of the record's own app ends its status (ingest would have left it `queued`); a job naming
        // another app than its record's key writes nothing there.
        let statuses = JobStatusStore(redis: harness.redis)
        let ended = try await statuses.read(app: app.id, jobID: "x")
        #expect(ended?.state == .done && ended?.jobDeadLettered == true, "\(String(describing: ended))")
        #expect(try await statuses.read(app: "no-such-app", jobID: "u-1") == nil)
        await harness.stop()
    }

    @Test("forged jobs (unsigned, badly signed, signed by another app, another app's appId) are dead-lettered and send nothing; the app's own signed job is delivered")
    func forgedJobs() async throws {
        let harness = try await DispatcherHarness.start()
        let (app, other) = (harness.apps.apps[0], harness.apps.apps[1])
        let token = deviceToken()
        func job(_ id: String) -> [UInt8] {
            var job = PushJob(id: id, appId: app.id, target: .device(token, tokenType: .alert, environment: .production))
            job.payload = .object(["aps": .object(["alert": .string(id)])])
            return job.encoded()
        }
        let key = "\(app.id)/device/\(token)"
        try await harness.produce(raw: job("unsigned"), key: key, headers: [])
        try await harness.produce(raw: job("zeros"), key: key,
                                  headers: [(JobSignature.header, Array("v1=".utf8) + Array(repeating: UInt8(ascii: "0"), count: 64))])
        // Each record is encoded once: `createdAt` is part of the bytes the signature covers.
        let otherAppSecret = job("other-app-secret")
        try await harness.produce(raw: otherAppSecret, key: key,
                                  headers: JobSignature.headers(for: otherAppSecret, secret: other.jobSecret))
        var tampered = job("tampered")
        let signature = JobSignature.headers(for: tampered, secret: app.jobSecret)
        tampered.append(UInt8(ascii: " "))
        try await harness.produce(raw: tampered, key: key, headers: signature)
        // The other app's producer, validly signed under its own key prefix, naming this app inside.
        let crossApp = job("cross-app"), own = job("own")
        try await harness.produce(raw: crossApp, key: "\(other.id)/device/\(token)",
                                  headers: JobSignature.headers(for: crossApp, secret: other.jobSecret))
        try await harness.produce(raw: own, key: key, headers: JobSignature.headers(for: own, secret: app.jobSecret))

        try await eventually("the app's own signed job was delivered") {
            harness.simulators.accepted().contains { $0["token"]?.stringValue == token }
        }
        let letters = try await harness.deadLetters(expecting: 5)
        #expect(letters.count == 5)
        let unsigned = letters.filter { $0["reason"]?.stringValue == "invalid_signature" }
        #expect(unsigned.count == 4 && unsigned.allSatisfy {
            $0["disposition"]?.stringValue == "invalid_signature" && $0["appId"]?.stringValue == app.id && $0["job"] == nil
        })
        let cross = letters.first { $0["reason"]?.stringValue == "invalid_job" }
        #expect(cross?["message"]?.stringValue?.contains("record key's app") == true, "\(String(describing: cross))")
        #expect(cross?["appId"]?.stringValue == app.id)
        try validateAgainstSchema(letters.map { $0.encoded() }, schema: "dead-letter.schema.json")
        let sent = harness.simulators.accepted().compactMap { $0[path: "payload", "aps", "alert"]?.stringValue }
        #expect(sent == ["own"])
        #expect(harness.metric("herald_dispatcher_dead_letters_total", labels: ["reason": "invalid_signature"]) == 4)
        await harness.stop()
    }

    @Test("final: true on a channel event removes the channel's subscriptions once its pushes settled; a later event sends nothing")
    func finalChannelEventClosesTheChannel() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[0]
        let channel = "order:\(SecureRandom.hex(4)):status"
        let tokens = (0..<3).map { _ in deviceToken() }
        for token in tokens { try await harness.subscribe(app, channel: channel, token: token) }
        var delivered = PushJob(id: "final-\(SecureRandom.hex(3))", appId: app.id, target: .channel(channel))
        delivered.alert = .object(["aps": .object(["alert": .string("delivered")])])
        delivered.final = true
        try await harness.produce(delivered)
        try await eventually("every subscriber got the final event") { harness.simulators.accepted().count == 3 }
        // The channel's index goes first, then the records (on a cluster they are on other masters).
        try await eventually("the channel's subscriptions are gone") {
            guard try await harness.redis.command(["EXISTS", RedisKeys(app: app.id).channel(channel)]).int == 0 else { return false }
            for token in tokens where !(try await harness.subscriptions.list(app: app.id, deviceToken: token).subscriptions.isEmpty) {
                return false
            }
            return true
        }
        var later = PushJob(id: "later-\(SecureRandom.hex(3))", appId: app.id, target: .channel(channel))
        later.alert = .object(["aps": .object(["alert": .string("later")])])
        try await harness.produce(later)
        try await eventually("the later job settled") { harness.metric("herald_dispatcher_jobs_completed_total") ?? 0 >= 2 }
        #expect(harness.simulators.accepted().count == 3, "nothing sent to a closed channel")
        await harness.stop()
    }

    /// A final channel event's record that runs again after its job finished (a rebalance before the commit) sends
    /// nothing and leaves alone the subscriptions made since the channel was closed.
    @Test("a final channel event's record run again after it finished keeps the channel's new subscriptions")
    func aClosedChannelsNewSubscriptionsStayWhenTheFinalRecordRunsAgain() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[0]
        let channel = "order:\(SecureRandom.hex(4)):status"
        // More than one send's worth, so the job keeps a record of its progress, which says it finished.
        let tokens = (0...JobRunner.pushesPerSend).map { _ in deviceToken() }
        for token in tokens { try await harness.subscribe(app, channel: channel, token: token) }
        var delivered = PushJob(id: "final-\(SecureRandom.hex(3))", appId: app.id, target: .channel(channel))
        delivered.alert = .object(["aps": .object(["alert": .string("delivered")])])
        delivered.final = true
        try await harness.produce(delivered)
        try await eventually("the job settled") { harness.metric("herald_dispatcher_jobs_completed_total") == 1 }
        #expect(harness.simulators.accepted().count == tokens.count)
        #expect(try await harness.redis.command(["EXISTS", RedisKeys(app: app.id).channel(channel)]).int == 0)
        let newcomer = deviceToken()
        try await harness.subscribe(app, channel: channel, token: newcomer)
        let record = try #require(try await readTopic(harness.topics.jobs, brokers: harness.topics.brokers, expecting: 1,
                                                      timeout: .seconds(20)).last)
        #expect(await harness.service.runner.run(record))
        #expect(harness.simulators.accepted().count == tokens.count, "nothing sent again")
        #expect(try await harness.subscriptions.list(app: app.id, deviceToken: newcomer).subscriptions.map(\.channel) == [channel],
                "the run again removed a subscription made after the channel closed")
        await harness.stop()
    }

    @Test("a subscription not renewed within its lifetime receives nothing and the sweep removes it from every index")
    func expiredSubscriptionsAreSwept() async throws {
        let harness = try await DispatcherHarness.start { $0.subscriptionSweepInterval = .milliseconds(200) }
        let app = harness.apps.apps[0]
        let channel = "news-\(SecureRandom.hex(4))"
        let (expiring, lasting) = (deviceToken(), deviceToken())
        let shortLived = SubscriptionStore(redis: harness.redis, ttl: .seconds(1))
        for token in [expiring, lasting] {
            _ = try await shortLived.upsert(app: app.id, SubscriptionInput(.object([
                "channel": .string(channel), "deviceToken": .string(token), "tokenType": .string("alert")])))
        }
        // Renewed with the usual lifetime: it stays.
        try await harness.subscribe(app, channel: channel, token: lasting)
        try await eventually("the sweep removed the expired subscription", timeout: .seconds(10)) {
            harness.metric("herald_dispatcher_subscriptions_expired_total") ?? 0 >= 1
        }
        #expect(try await harness.redis.command(["HLEN", RedisKeys(app: app.id).channel(channel)]).int == 1)
        #expect(try await harness.redis.command(["EXISTS", RedisKeys(app: app.id).device(expiring)]).int == 0)
        var job = PushJob(id: "sweep-\(SecureRandom.hex(3))", appId: app.id, target: .channel(channel))
        job.alert = .object(["aps": .object(["alert": .string("hi")])])
        try await harness.produce(job)
        try await eventually("the push arrived") { !harness.simulators.accepted().isEmpty }
        try await Task.sleep(for: .milliseconds(300))
        #expect(harness.simulators.accepted().compactMap { $0["token"]?.stringValue } == [lasting])
        await harness.stop()
    }

    @Test("a 600 KB garbage record is dead-lettered unread (16 KiB of it, its size and SHA-256), and the valid job behind it is delivered and committed")
    func hugeGarbageRecord() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[0]
        let token = deviceToken()
        let garbage = String(repeating: "\"", count: 600_000)
        try await harness.produce(raw: garbage, key: "\(app.id)/device/\(token)")
        var valid = PushJob(id: "after-garbage", appId: app.id, target: .device(token, tokenType: .alert, environment: .production))
        valid.payload = .object(["aps": .object(["alert": .string("still here")])])
        try await harness.produce(valid)

        try await eventually("the valid job behind the garbage was delivered", timeout: .seconds(10)) {
            harness.simulators.accepted().contains { $0["token"]?.stringValue == token }
        }
        let records = try await readTopic(harness.topics.deadLetters, brokers: harness.topics.brokers, expecting: 1,
                                          timeout: .seconds(5))
        let record = try #require(records.first)
        #expect(record.value.count < 40_000, "a dead letter of \(record.value.count) bytes")
        let letter = try DeadLetter.decode(record.value)
        #expect(letter.disposition == .invalidJob)
        #expect(letter.rawJobBytes == 600_000)
        #expect(letter.rawJob == String(repeating: "\"", count: 16 * 1024))
        #expect(letter.rawJobSha256 == Hex.encode(SHA256.hash(Array(garbage.utf8))))
        #expect(letter.message?.contains("HERALD_MAX_JOB_BYTES") == true, "\(letter.message ?? "")")
        try validateAgainstSchema([record.value], schema: "dead-letter.schema.json")

        // Both records settled: the group's offset is past the valid job.
        let held = try await readTopic(harness.topics.jobs, brokers: harness.topics.brokers, expecting: 2, timeout: .seconds(5))
        let partition = try #require(held.last?.partition)
        let end = (held.map(\.offset).max() ?? -1) + 1
        let committed = try KafkaConsumer(configuration: KafkaConsumerConfiguration(
            kafka: KafkaConfiguration(brokerList: harness.topics.brokers), groupID: harness.topics.group), logger: testLogger)
        try await eventually("the group committed past both records") {
            try await committed.committed([KafkaTopicPartition(topic: harness.topics.jobs, partition: partition)])
                .first?.offset == end
        }
        try await committed.close()
        await harness.stop()
    }

    @Test("a channel whose index Redis refuses to read (WRONGTYPE) is dead-lettered whole after a few tries; the next job is delivered")
    func refusedChannelIndex() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[0]
        let channel = "broken-\(SecureRandom.hex(4))"
        // A string where the channel's hash belongs: every HSCAN of it answers WRONGTYPE.
        _ = try await harness.redis.command(["SET", RedisKeys(app: app.id).channel(channel), "not a hash"])
        var broken = PushJob(id: "refused-\(SecureRandom.hex(4))", appId: app.id, target: .channel(channel))
        broken.alert = .object(["aps": .object(["alert": .string("never sent")])])
        try await harness.produce(broken)
        let token = deviceToken()
        var valid = PushJob(id: "after-refused", appId: app.id, target: .device(token, tokenType: .alert, environment: .production))
        valid.payload = .object(["aps": .object(["alert": .string("still here")])])
        try await harness.produce(valid)

        try await eventually("the job after it was delivered") {
            harness.simulators.accepted().contains { $0["token"]?.stringValue == token }
        }
        let records = try await readTopic(harness.topics.deadLetters, brokers: harness.topics.brokers, expecting: 1,
                                          timeout: .seconds(10))
        let letter = try DeadLetter.decode(try #require(records.first).value)
        #expect(letter.disposition == .storeError && letter.reason == "store_error")
        #expect(letter.job?.id == broken.id && letter.job?.target.channel == channel)
        #expect(letter.attempts == 5)
        #expect(letter.message?.contains("WRONGTYPE") == true, "\(letter.message ?? "")")
        #expect(records.first.map { String(decoding: $0.key ?? [], as: UTF8.self) } == "\(app.id)/job/\(broken.id)")
        try validateAgainstSchema([records[0].value], schema: "dead-letter.schema.json")
        #expect(harness.metric("herald_dispatcher_dead_letters_total", labels: ["reason": "store_error"]) == 1)
        await harness.stop()
    }

    @Test("a job produced by a non-Swift client (Python confluent-kafka) is delivered")
    func foreignProducer() async throws {
        let harness = try await DispatcherHarness.start()
        let app = harness.apps.apps[1]
        let token = deviceToken()
        let job = #"{"version": 1, "id": "py-1", "appId": "\#(app.id)", "createdAt": "2025-01-01T00:00:00.000Z", "target": {"kind": "device", "deviceToken": "\#(token)", "tokenType": "alert"}, "payload": {"aps": {"alert": {"title": "from python"}}, "k": [1, 2]}, "priority": 5}"#
        // Signed with the app's own secret (jobSigningSecretPaths), as a direct producer signs.
        let script = """
            import hashlib, hmac, sys
            from confluent_kafka import Producer
            value = sys.stdin.read().encode()
            secret = open(sys.argv[4], "rb").read().strip()
            signature = "v1=" + hmac.new(secret, value, hashlib.sha256).hexdigest()
            p = Producer({"bootstrap.servers": sys.argv[1], "enable.idempotence": True, "acks": "all"})
            p.produce(sys.argv[2], key=sys.argv[3].encode(), value=value, headers=[("herald-signature", signature)])
            assert p.flush(10) == 0
            """
        _ = try runTool("python3", ["-c", script, harness.topics.brokers, harness.topics.jobs, "\(app.id)/device/\(token)",
                                    app.jobSecretPath], input: Data(job.utf8))
        try await eventually("the push arrived") { !harness.simulators.accepted().isEmpty }
        let push = try #require(harness.simulators.accepted().first)
        #expect(push["token"]?.stringValue == token)
        #expect(push["topic"]?.stringValue == app.bundleID)
        #expect(push["priority"]?.numberValue == 5)
        #expect(push[path: "payload", "aps", "alert", "title"]?.stringValue == "from python")
        #expect(push[path: "payload", "k"] == .array([.number(1), .number(2)]))
        await harness.stop()
    }

    @Test("a busy key pauses its own partition at 8 jobs under way: another partition's job goes at once, and its jobs arrive in order")
    func aBusyKeyHoldsUpOnlyItsOwnPartition() async throws {
        let harness = try await DispatcherHarness.start { configuration in
            configuration.maxInFlightJobs = 16
            // Paused on purpose, partition 0 stops moving for longer than this: the watchdog must not call it stalled.
            configuration.fetchStallRecovery = FetchStallRecovery(stallTimeout: .seconds(3))
        }
        let app = harness.apps.apps[0]
        // The hot channel's first push takes 6 s to answer (twice the stall timeout); its 20 jobs queue behind it on
        // partition 0.
        try harness.simulators.production.setRules([.delay(tokenPrefix: "b05e", milliseconds: 6_000, times: 1)])
        let hot = "hot-\(SecureRandom.hex(4))", quiet = "quiet-\(SecureRandom.hex(4))"
        try await harness.subscribe(app, channel: hot, token: deviceToken("b05e"))
        let other = deviceToken()
        try await harness.subscribe(app, channel: quiet, token: other)
        for index in 0..<20 {
            var job = PushJob(id: "hot-\(index)-\(SecureRandom.hex(4))", appId: app.id, target: .channel(hot))
            job.alert = .object(["aps": .object(["alert": .string("\(index)")])])
            try await harness.produce(job, partition: 0)
        }
        try await eventually("the hot channel's jobs are under way") {
            harness.metric("herald_dispatcher_in_flight_jobs") ?? 0 >= 8
        }
        try await Task.sleep(for: .milliseconds(300))
        var most = harness.metric("herald_dispatcher_in_flight_jobs") ?? 0
        var job = PushJob(id: "quiet-\(SecureRandom.hex(4))", appId: app.id, target: .channel(quiet))
        job.alert = .object(["aps": .object(["alert": .string("quiet")])])
        try await harness.produce(job, partition: 1)
        let watched = ContinuousClock.now
        while !harness.simulators.accepted().contains(where: { $0["token"]?.stringValue == other }),
              ContinuousClock.now - watched < .seconds(20) {
            most = max(most, harness.metric("herald_dispatcher_in_flight_jobs") ?? 0)
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(most <= 9, "the busy key held \(most) of 16 slots")
        #expect(!harness.simulators.accepted().contains { $0["token"]?.stringValue != other },
                "the quiet push went while the hot channel's first was still unanswered")
        #expect(harness.metric("herald_dispatcher_busy_key_pauses_total") ?? 0 >= 1)
        try await eventually("every hot job delivered", timeout: .seconds(30)) {
            harness.simulators.accepted().count == 21
        }
        let order = harness.simulators.accepted().filter { $0["token"]?.stringValue != other }
            .compactMap { $0[path: "payload", "aps", "alert"]?.stringValue }
        #expect(order == (0..<20).map(String.init), "one key's jobs run in offset order across the pauses")
        #expect(harness.metric("herald_dispatcher_fetch_stalls_total") == 0, "a paused partition is no stall")
        await harness.stop()
    }

    @Test("with maxInFlightJobs running and APNs slow to answer, no job starts beyond the limit; every job is delivered once there is room")
    func inFlightJobsStayWithinTheLimit() async throws {
        let harness = try await DispatcherHarness.start { $0.maxInFlightJobs = 2 }
        let app = harness.apps.apps[0]
        try harness.simulators.production.setRules([.delay(tokenPrefix: "5e0d", milliseconds: 1_000)])
        var tokens: [String] = []
        for index in 0..<8 {
            let channel = "slow-\(index)-\(SecureRandom.hex(4))", token = deviceToken("5e0d")
            tokens.append(token)
            try await harness.subscribe(app, channel: channel, token: token)
            var job = PushJob(id: "slow-\(index)-\(SecureRandom.hex(4))", appId: app.id, target: .channel(channel))
            job.alert = .object(["aps": .object(["alert": .string("hello")])])
            try await harness.produce(job)
        }
        // The full loop keeps polling (every 200 ms) to stay in the group; what it gets must wait in the broker.
        var most = 0.0
        let watched = ContinuousClock.now
        while ContinuousClock.now - watched < .seconds(3) {
            most = max(most, harness.metric("herald_dispatcher_in_flight_jobs") ?? 0)
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(most == 2)
        try await eventually("every job settled", timeout: .seconds(30)) {
            harness.metric("herald_dispatcher_jobs_completed_total") == 8
        }
        #expect(Set(harness.simulators.accepted().compactMap { $0["token"]?.stringValue }) == Set(tokens))
        #expect(harness.simulators.accepted().count == 8)
        await harness.stop()
    }

    @Test("while Redis refuses a fan-out's progress writes, the settled pushes kept to mark stay bounded and all are counted")
    func settledPushesKeptWhileWritesFailAreBounded() async throws {
        let redis = RedisClient(configuration: try RedisConfiguration(url: try TestEnvironment.redisURL()))
        let app = "budget-" + SecureRandom.hex(4)
        let (settled, statuses, job, key) = try await recordingFanOut(redis, app: app)
        // A key of another type where the progress record belongs: every write of marks fails, reads go on.
        try await redis.command(["SET", key, "not a hash"])
        for _ in 0..<30 {
            await settled.record((0..<100).map { _ in SettledPush(token: SecureRandom.hex(32), outcome: .delivered, retries: 0) })
        }
        #expect(settled.pendingCount == SettledPushes.maximumPending)
        try await redis.command(["DEL", key])
        try await settled.finish()
        let status = try #require(try await statuses.read(app: app, jobID: job.id))
        #expect(status.counts.delivered == 3_000 && status.state == .done, "\(status.counts)")
        try await redis.command(["DEL", key, RedisKeys(app: app).jobStatus(job.id)])
        await redis.close()
    }

    /// The settled pushes of a recording fan-out of a made-up job, as a job's run makes them, and its progress key.
    private func recordingFanOut(_ redis: RedisClient, app: String) async throws
        -> (settled: SettledPushes, statuses: JobStatusStore, job: PushJob, key: String) {
        let statuses = JobStatusStore(redis: redis)
        let job = PushJob(id: "j-" + SecureRandom.hex(4), appId: app, target: .channel("news"))
        let progress = FanOutProgress(statuses: statuses, group: "g", ttl: .seconds(60))
        let source = DeadLetter.Source(topic: "t", partition: 0, offset: 7)
        let settled = SettledPushes(job: job, source: source, progress: progress,
                                    logger: Logger(label: "test", minimumLevel: .error))
        _ = try await settled.start()
        settled.startRecording()
        return (settled, statuses, job, progress.key(app: app, source, job: job.id))
    }

    /// A write of settled pushes that Redis ran but whose answer was lost (the client gave up on a server busy
    /// with a slow script) leaves them to be written again: the cursor saved meanwhile keeps their marks, so the
    /// second write finds them and the job's status counts each push once; the next cursor saved after that write
    /// drops them.
    @Test("a progress write whose answer was lost counts its pushes once")
    func aProgressWriteWhoseAnswerWasLostCountsOnce() async throws {
        var configuration = try RedisConfiguration(url: try TestEnvironment.redisURL())
        configuration.commandTimeout = .milliseconds(300)
        let redis = RedisClient(configuration: configuration)
        let app = "lost-" + SecureRandom.hex(4)
        let (settled, statuses, job, key) = try await recordingFanOut(redis, app: app)
        // A first write loads the write's script on the node: otherwise the lost write would be an `EVALSHA` that
        // Redis answers `NOSCRIPT` once the blocking script is done, and nothing would be written.
        let first = SecureRandom.hex(32)
        await settled.record([SettledPush(token: first, outcome: .delivered, retries: 0)])
        #expect(settled.pendingCount == 0)
        // Probed from a client of its own, connected before the script starts: a probe timing out on `redis` would
        // have its next command wait behind the reset (and, in a cluster, behind a map refresh asking the busy
        // node), never reaching Redis at all.
        var probing = try RedisConfiguration(url: try TestEnvironment.redisURL())
        probing.commandTimeout = .milliseconds(300)
        let prober = RedisClient(configuration: probing)
        try await eventually("the prober is connected") { (try? await prober.command(["EXISTS", key])) != nil }
        // Two seconds of a script on the progress record's node: the write waits behind it, the client gives up
        // after 300 ms, and Redis runs the write once the script is done.
        var blocking = try RedisConfiguration(url: try TestEnvironment.redisURL())
        blocking.commandTimeout = .seconds(10)
        let blocker = RedisClient(configuration: blocking)
        async let busy = blocker.run(RedisScript(source: """
            local function now() local t = redis.call('TIME'); return tonumber(t[1]) * 1000000 + tonumber(t[2]) end
            local start = now()
            while now() - start < 2000000 do end
            return 1
            """), keys: [key], args: [])
        try await eventually("the record's node is busy with the script", timeout: .seconds(2)) {
            do { _ = try await prober.command(["EXISTS", key]); return false } catch let error as RedisError {
                return error.code == .timeout
            }
        }
        let tokens = (0..<3).map { _ in SecureRandom.hex(32) }
        await settled.record(tokens.map { SettledPush(token: $0, outcome: .delivered, retries: 0) })
        #expect(settled.pendingCount == 3, "the write timed out")
        _ = try await busy
        try await eventually("the write ran after all") {
            try await redis.command(["HEXISTS", key, "s:" + tokens[0]]).int == 1
        }
        func marked(_ token: String) async throws -> Bool { try await redis.command(["HEXISTS", key, "s:" + token]).int == 1 }
        try await settled.advance(cursor: "42", server: nil, covering: tokens)
        #expect(try await marked(tokens[0]), "kept while not written for sure")
        let later = SecureRandom.hex(32)
        await settled.record([SettledPush(token: later, outcome: .delivered, retries: 0)]) // writes the three again
        #expect(settled.pendingCount == 0)
        try await settled.advance(cursor: "84", server: "5eed0f5eed0f", covering: [later])
        #expect(try await redis.command(["HGET", key, "cursor"]).string == "84@5eed0f5eed0f", "the cursor with its server")
        for token in tokens + [later] { #expect(try await !marked(token), "dropped once written for sure") }
        try await settled.finish()
        let status = try #require(try await statuses.read(app: app, jobID: job.id))
        #expect(status.counts.delivered == 5, "\(status.counts)")
        try await redis.command(["DEL", key, RedisKeys(app: app).jobStatus(job.id)])
        await blocker.close()
        await prober.close()
        await redis.close()
    }

    @Test("fan-outs running together hold at most maxBatchesHeld batches between them, and each delivers every push once")
    func fanOutsShareOneBatchBudget() async throws {
        let harness = try await DispatcherHarness.start {
            $0.batchSize = 50
            $0.maxBatchesInFlightPerJob = 3
            $0.maxBatchesHeld = 4
        }
        let app = harness.apps.apps[0]
        try harness.simulators.production.setRules([.delay(tokenPrefix: "b0d9", milliseconds: 100)])
        var jobs: [PushJob] = []
        var tokens: Set<String> = []
        for index in 0..<6 {
            let channel = "budget-\(index)-\(SecureRandom.hex(4))"
            for _ in 0..<300 {
                let token = deviceToken("b0d9")
                tokens.insert(token)
                _ = try await harness.subscribe(app, channel: channel, token: token)
            }
            var job = PushJob(id: "budget-\(index)-\(SecureRandom.hex(4))", appId: app.id, target: .channel(channel))
            job.alert = .object(["aps": .object(["alert": .string("hello")])])
            jobs.append(job)
        }
        for job in jobs { try await harness.produce(job) }
        let permits = harness.service.runner.batchPermits
        var most = 0
        let watched = ContinuousClock.now
        while harness.metric("herald_dispatcher_jobs_completed_total") != 6, ContinuousClock.now - watched < .seconds(60) {
            most = max(most, permits.held)
            try await Task.sleep(for: .milliseconds(5))
        }
        #expect(harness.metric("herald_dispatcher_jobs_completed_total") == 6)
        // Six fan-outs of 6 batches, 3 sending and 2 read ahead each, would hold up to 30 without the budget.
        #expect(most == 4, "at most 4 batches held, and the fan-outs wanted more")
        #expect(permits.held == 0, "every permit given back")
        let accepted = harness.simulators.accepted().compactMap { $0["token"]?.stringValue }
        #expect(accepted.count == 1_800 && Set(accepted) == tokens)
        await harness.stop()
    }
}
