import Foundation
@testable import HeraldDispatcher
import HeraldCore
import HeraldCrypto
import HeraldKafka
import HeraldRedis
import HeraldRuntime
@testable import HeraldStore
import HeraldTestSupport
import Testing

@Suite("Dispatcher units")
struct UnitTests {
    @Test("a first fetch that leaves out records at the committed offset is a gap: no commit passes them")
    func aGapAtTheStartOfAnAssignment() {
        var offsets = PartitionOffsets()
        offsets.expect(from: 10)
        #expect(offsets.receive(12) == .startAfterGap(missingFrom: 10, count: 2))
        offsets.settle(12)
        #expect(offsets.commitPosition == 10, "10 and 11 are missing")
        #expect(offsets.receive(10) == .start)
        #expect(offsets.receive(11) == .start)
        offsets.settle(10)
        offsets.settle(11)
        #expect(offsets.commitPosition == 13)
        // A first record before the expected start (the broker reset a position it no longer has) starts as usual.
        var reset = PartitionOffsets()
        reset.expect(from: 50)
        #expect(reset.receive(0) == .start)
        reset.settle(0)
        #expect(reset.commitPosition == 1)
    }

    @Test("missing offsets the log no longer starts at stop holding commits back; those after the log start stay missing")
    func missingOffsetsDeletedByRetention() {
        var offsets = PartitionOffsets()
        #expect(offsets.receive(0) == .start)
        #expect(offsets.receive(5) == .startAfterGap(missingFrom: 1, count: 4))
        #expect(offsets.receive(9) == .startAfterGap(missingFrom: 6, count: 3))
        for offset: Int64 in [0, 5, 9] { offsets.settle(offset) }
        #expect(offsets.commitPosition == 1)
        #expect(offsets.logStarts(at: 0) == 0)
        #expect(offsets.logStarts(at: 7) == 5, "1-4 and 6 are gone; 7 and 8 are still in the log")
        #expect(offsets.missing == [7..<9] && offsets.commitPosition == 7)
        #expect(offsets.logStarts(at: 20) == 2)
        #expect(offsets.missing.isEmpty && offsets.commitPosition == 10)

        let book = PartitionBook(metrics: DispatcherMetrics(MetricsRegistry()))
        let (p0, p1) = (KafkaTopicPartition(topic: "jobs", partition: 0), KafkaTopicPartition(topic: "jobs", partition: 1))
        book.rebalance(.assigned([p0, p1]))
        book.expect([p0: 3])
        book.start(KafkaRecord(topic: "jobs", partition: 0, offset: 6, key: nil, value: [], headers: [], timestamp: nil)) { _, _ in Task {} }
        #expect(book.isMissingOffsets(p0) && !book.isMissingOffsets(p1))
        #expect(book.rereadsDue().map(\.offset) == [3])
        #expect(book.logStarts([p0: 5, p1: 100]) == [p0: 2])
        #expect(book.isMissingOffsets(p0), "offset 5 is still in the log")
        #expect(book.logStarts([p0: 6]) == [p0: 1])
        #expect(!book.isMissingOffsets(p0) && book.rereadsDue().isEmpty)
    }

    @Test("commits never pass an unsettled job, whatever order jobs settle in")
    func commitPosition() {
        var offsets = PartitionOffsets()
        #expect(offsets.commitPosition == nil)
        for offset in Int64(10)...14 { #expect(offsets.receive(offset) == .start) }
        offsets.settle(12)
        offsets.settle(10)
        #expect(offsets.commitPosition == 11, "11 is still running")
        offsets.settle(11)
        #expect(offsets.commitPosition == 13)
        offsets.committed = 13
        #expect(offsets.uncommitted == nil)
        offsets.settle(14)
        #expect(offsets.commitPosition == 13)
        offsets.settle(13)
        #expect(offsets.commitPosition == 15)
        #expect(offsets.uncommitted == 15)
    }

    @Test("offsets a fetch skipped are missing until received, commits wait for them, and a re-read's repeats are duplicates")
    func offsetGaps() {
        var offsets = PartitionOffsets()
        #expect(offsets.receive(5) == .start)
        #expect(offsets.receive(6) == .start)
        #expect(offsets.receive(9) == .startAfterGap(missingFrom: 7, count: 2))
        #expect(offsets.receive(12) == .startAfterGap(missingFrom: 10, count: 2))
        for offset: Int64 in [5, 6, 9, 12] { offsets.settle(offset) }
        #expect(offsets.firstMissing == 7)
        #expect(offsets.commitPosition == 7, "7 was never seen: the commit waits")
        // Reading again from 7: what arrived before is dropped, what was missing runs.
        #expect(offsets.receive(8) == .start)
        #expect(offsets.receive(9) == .duplicate)
        #expect(offsets.missing == [7..<8, 10..<12])
        #expect(offsets.receive(7) == .start)
        #expect(offsets.receive(11) == .start)
        #expect(offsets.receive(10) == .start)
        #expect(offsets.missing.isEmpty)
        #expect(offsets.receive(12) == .duplicate)
        #expect(offsets.commitPosition == 7, "7, 8, 10 and 11 run")
        for offset: Int64 in [7, 8, 10, 11] { offsets.settle(offset) }
        #expect(offsets.commitPosition == 13)
        #expect(offsets.receive(13) == .start)
    }

    @Test("a partition revoked and assigned again within one poll is reported for a re-read; one revoked for good, or assigned and then revoked, is not")
    func rebalancesWithinOnePoll() {
        let book = PartitionBook(metrics: DispatcherMetrics(MetricsRegistry()))
        let (p0, p1, p2) = (KafkaTopicPartition(topic: "jobs", partition: 0), KafkaTopicPartition(topic: "jobs", partition: 1),
                            KafkaTopicPartition(topic: "jobs", partition: 2))
        book.rebalance(.assigned([p0, p1]))
        book.beginPoll()
        // Eager rebalancing: everything is revoked, then the new assignment arrives; then another round takes p2.
        book.rebalance(.revoked([p0, p1]))
        book.rebalance(.assigned([p0, p2]))
        book.rebalance(.revoked([p0, p2]))
        book.rebalance(.assigned([p0]))
        let poll = book.endPoll()
        #expect(poll.assigned == [p0])
        #expect(poll.revoked == [p0, p1, p2])
        #expect(poll.reassigned == [p0], "p1 went to another member; p2 came and went within the poll")
        book.beginPoll()
        let quiet = book.endPoll()
        #expect(quiet.revoked.isEmpty && quiet.reassigned.isEmpty)
    }

    @Test("a partition to read again from its committed offset stays pending until a seek succeeds, retried a second after a failure, and is forgotten once revoked")
    func rewindsPendingUntilTheSeekSucceeds() {
        var fetch = FetchState(configuration: DispatcherConfiguration())
        let (p0, p1) = (KafkaTopicPartition(topic: "jobs", partition: 0), KafkaTopicPartition(topic: "jobs", partition: 1))
        let start = ContinuousClock.now
        fetch.rewind([p0, p1], revoked: [p0, p1])
        #expect(fetch.rewindsPending == [p0, p1] && fetch.rewindDue(now: start))
        fetch.rewound(false, now: start)
        #expect(!fetch.rewindDue(now: start + .milliseconds(500)), "a failed seek waits a second")
        #expect(fetch.rewindDue(now: start + .seconds(1)))
        fetch.rewind([], revoked: [p1])
        #expect(fetch.rewindsPending == [p0], "p1 went to another member, which starts from the committed offset")
        fetch.rewind([], revoked: [])
        #expect(fetch.rewindsPending == [p0], "a quiet poll keeps what is pending")
        fetch.rewound(true, now: start + .seconds(1))
        #expect(fetch.rewindsPending.isEmpty && !fetch.rewindDue(now: start + .seconds(2)))
        fetch.rewind([p1], revoked: [p1])
        fetch.replaced(fetchWait: .seconds(1), at: start + .seconds(2))
        #expect(fetch.rewindsPending.isEmpty, "a replacement consumer starts every partition from its committed offset")
    }

    @Test("the concurrency limit admits at most its size, in order, and a cancelled waiter leaves the queue")
    func concurrencyLimit() async throws {
        let limit = ConcurrencyLimit(limit: 2)
        try await limit.acquire()
        try await limit.acquire()
        let waiter = Task { try await limit.acquire() }
        let cancelled = Task { try await limit.acquire() }
        try await Task.sleep(for: .milliseconds(50))
        cancelled.cancel()
        await #expect(throws: CancellationError.self) { try await cancelled.value }
        limit.release()
        try await waiter.value // got the released slot
        let third = Task { try await limit.acquire() }
        try await Task.sleep(for: .milliseconds(50))
        limit.release()
        try await third.value
    }

    @Test("a waiter for several slots gets them together, in arrival order; cancelling it lets the next one through")
    func concurrencyLimitGroups() async throws {
        let limit = ConcurrencyLimit(limit: 4)
        try await limit.acquire(4)
        let group = Task { try await limit.acquire(3) }
        try await Task.sleep(for: .milliseconds(50))
        let single = Lock(false)
        let behind = Task {
            try await limit.acquire()
            single.withLock { $0 = true }
        }
        try await Task.sleep(for: .milliseconds(50))
        limit.release(count: 2)
        try await Task.sleep(for: .milliseconds(50))
        #expect(!single.withLock { $0 }, "two free slots wait for the group of three that came first")
        #expect(!limit.tryAcquire())
        group.cancel()
        await #expect(throws: CancellationError.self) { try await group.value }
        try await behind.value
        #expect(single.withLock { $0 })
        // One slot is free, three are held: a group of three gets its slots when two more come back together.
        let second = Task { try await limit.acquire(3) }
        try await Task.sleep(for: .milliseconds(50))
        limit.release(count: 2)
        try await second.value
        #expect(!limit.tryAcquire(), "all four are held again")
        limit.release(count: 4)
        try await limit.acquire(9) // more than the limit asks for all of it
        #expect(!limit.tryAcquire())
    }

    @Test("the prompt lane is served before the bulk lane, whatever the order they came in")
    func concurrencyLimitLanes() async throws {
        let limit = ConcurrencyLimit(limit: 4)
        try await limit.acquire(4, in: .bulk)
        let order = Lock<[String]>([])
        let bulk = Task {
            try await limit.acquire(2, in: .bulk)
            order.withLock { $0.append("bulk") }
        }
        try await Task.sleep(for: .milliseconds(50))
        let prompt = Task {
            try await limit.acquire(2, in: .prompt)
            order.withLock { $0.append("prompt") }
        }
        try await Task.sleep(for: .milliseconds(50))
        limit.release(count: 1)
        try await Task.sleep(for: .milliseconds(50))
        #expect(!limit.tryAcquire(in: .bulk), "a prompt waiter the free slot does not cover holds the bulk lane back")
        limit.release(count: 1)
        try await prompt.value
        #expect(order.withLock { $0 } == ["prompt"], "the bulk waiter came first and still waits")
        limit.release(count: 2)
        try await bulk.value
        #expect(order.withLock { $0 } == ["prompt", "bulk"])
        // With a bulk waiter in line, a free slot still goes to a prompt caller at once.
        let behind = Task { try await limit.acquire(3, in: .bulk) }
        try await Task.sleep(for: .milliseconds(50))
        limit.release(count: 1)
        #expect(!limit.tryAcquire(in: .bulk))
        #expect(limit.tryAcquire(in: .prompt))
        behind.cancel()
        await #expect(throws: CancellationError.self) { try await behind.value }
    }

    @Test("Redis answers about the data (WRONGTYPE, a script's Lua error) count towards a refusal; refused writes, missing permissions and outages do not")
    func storeRefusalsAreAnswersAboutTheData() async throws {
        let redis = RedisClient(configuration: try RedisConfiguration(url: try TestEnvironment.redisURL()))
        let key = "herald:test:{\(SecureRandom.hex(6))}:string"
        _ = try await redis.command(["SET", key, "not a hash", "EX", "60"])
        func thrown(_ command: [String]) async -> (any Error)? {
            do { _ = try await redis.command(command); return nil } catch { return error }
        }
        let wrongType = await thrown(["EVAL", "return redis.call('HGET', KEYS[1], 'f')", "1", key])
        let luaError = await thrown(["EVAL", "return tonumber(redis.call('GET', KEYS[1])) > 1", "1", key])
        #expect(wrongType.flatMap(StoreRefusal.dataError) != nil, "\(String(describing: wrongType))")
        #expect(luaError.flatMap(StoreRefusal.dataError) != nil, "\(String(describing: luaError))")
        // Redis 6's wrapping of a Lua error, and what an operator fixes (as Redis 7 and 6 word them).
        #expect(StoreRefusal.dataError(RedisError(.server, "ERR Error running script (call to f_1): @user_script:1: user_script:1: attempt to compare nil with number")) != nil)
        for wrapped in ["ERR Error running script (call to f_1): @user_script:1: WRONGTYPE Operation against a key holding the wrong kind of value",
                        "ERR Error running script (call to f_1): @user_script:1: @user_script: 1: -WRONGTYPE Operation against a key holding the wrong kind of value"] {
            #expect(StoreRefusal.dataError(RedisError(.server, wrapped)) != nil, "Redis 6's WRONGTYPE in a script: \(wrapped)")
        }
        for operators in ["ERR The user executing the script can't run this command or subcommand script: 21, on @user_script:1.",
                          "NOPERM this user has no permissions to run the 'hset' command",
                          "OOM command not allowed when used memory > 'maxmemory'. script: 11, on @user_script:1.",
                          "ERR Error running script (call to f_1): @user_script:1: -OOM command not allowed when used memory > 'maxmemory'",
                          "READONLY You can't write against a read only replica."] {
            #expect(StoreRefusal.dataError(RedisError(.server, operators)) == nil, "\(operators)")
        }
        #expect(StoreRefusal.dataError(RedisError(.unavailable, "LOADING Redis is loading the dataset in memory")) == nil)
        #expect(StoreRefusal.dataError(RedisError(.timeout, "no answer")) == nil)
        _ = try await redis.command(["DEL", key])
        await redis.close()
    }

    @Test("backoff doubles per attempt within half and all of the ceiling, capped by the maximum")
    func backoff() {
        let backoff = RetryBackoff(initial: .milliseconds(100), maximum: .seconds(1))
        for attempt in 1...6 {
            let ceiling = min(Duration.seconds(1), .milliseconds(100) * (1 << (attempt - 1)))
            for _ in 0..<20 {
                let delay = backoff.delay(attempt: attempt)
                #expect(delay >= ceiling / 2 && delay <= ceiling)
            }
        }
    }

    @Test("a final post update is sent as an end event; Live Activity pushes carry aps.timestamp")
    func plans() throws {
        let apps = try TestApps(count: 1)
        defer { apps.remove() }
        let app = try #require(apps.directory.apps[apps.apps[0].id])
        var job = PushJob(id: "p", appId: app.id, target: .post("abcdef0123"))
        job.liveActivity = PushJob.LiveActivity(event: .update, contentState: .object(["a": .number(1)]))
        job.final = true
        let plan = try JobPlan(job: job, app: app, timestamp: 1_700_000_000)
        let registration = ActivityPushTarget(pushToken: SecureRandom.hex(32), environment: .production,
                                              bundleID: app.apns.bundleId + ".widget")
        let push = try #require(plan.push(for: registration))
        let payload = try JSONDecoder().decode(JSONValue.self, from: Data(push.payload))
        #expect(payload[path: "aps", "event"]?.stringValue == "end")
        #expect(payload[path: "aps", "timestamp"]?.numberValue == 1_700_000_000)
        #expect(push.topic == app.apns.bundleId + ".widget.push-type.liveactivity")

        var device = PushJob(id: "d", appId: app.id, target: .device("ab" + String(repeating: "0", count: 62),
                                                                  tokenType: .liveActivityUpdate, environment: .sandbox))
        device.payload = .object(["aps": .object(["event": .string("update"), "content-state": .object([:])])])
        let devicePush = try #require(try JobPlan(job: device, app: app, timestamp: 42).devicePush(timestamp: 42))
        #expect(devicePush.pushType == .liveactivity)
        #expect(devicePush.topic == app.apns.bundleId + ".push-type.liveactivity")
        #expect(devicePush.environment == .sandbox)
        let sent = try JSONDecoder().decode(JSONValue.self, from: Data(devicePush.payload))
        #expect(sent[path: "aps", "timestamp"]?.numberValue == 42)

        // A push type whose topic carries a suffix gets it: VoIP goes to `<bundle>.voip`, widgets to
        // `<bundle>.push-type.widgets` (APNs answers InvalidPushType to the bare bundle id).
        for (type, suffix) in [("voip", ".voip"), ("widgets", ".push-type.widgets"), ("background", "")] {
            var typed = PushJob(id: "t", appId: app.id, target: .device("cd" + String(repeating: "0", count: 62),
                                                                     tokenType: .alert, environment: .production))
            typed.pushType = type
            typed.priority = 5
            typed.payload = .object(["aps": .object([:])])
            let typedPush = try #require(try JobPlan(job: typed, app: app, timestamp: 42).devicePush(timestamp: 42))
            #expect(typedPush.topic == app.apns.bundleId + suffix && typedPush.pushType.rawValue == type)
        }

        device.target.topic = "com.other.app"
        #expect(throws: JobPlan.Refusal.self) { try JobPlan(job: device, app: app, timestamp: 42) }
    }
}
