import Foundation
import HeraldTestSupport
import Testing

@Suite("Fault injection: Redis outage", .serialized)
struct FaultRedisOutageTests {
    /// The test's own redis-server (append-only, fsync always, same folder across the restart; see `RedisServer`)
    /// under one ingest and one dispatcher; it is killed with SIGKILL while 40 events a second stream in, stays down
    /// three seconds and comes back on the same port. Neither service is restarted.
    @Test("Redis crashed and restarted under load: 503 only during the outage, both services recover by themselves, no accepted event lost")
    func redisOutage() async throws {
        let started = ContinuousClock.now
        let directory = try scratchDirectory("herald-fault-redis-")
        let apps = try TestApps(count: 1)
        defer { apps.remove() }
        let redis = try RedisServer(directory: directory)
        try await redis.start()
        let topics = FaultTopics(brokers: try TestEnvironment.kafkaBrokers())
        let perChannel = 3
        let stack = try await FaultStack.start(apps: apps, redisURL: redis.url, topics: topics, directory: directory,
                                               channelCount: 16, perChannel: perChannel)
        let (simulator, ingest, dispatcher, audience) = (stack.simulator, stack.ingest, stack.dispatcher, stack.audience)
        let app = apps.apps[0]

        let stream = EventStream(app: app, audience: audience, targets: [ingest], perSecond: 40)
        stream.start()
        try await Task.sleep(for: .seconds(2))
        let clock = ContinuousClock()
        let crashedAt = clock.now
        await redis.crash()
        // Both notice: /readyz 503 while Redis is away (and both stay alive).
        try await eventually("ingest reports Redis unreachable", timeout: .seconds(5)) { await ingest.readyStatus() == 503 }
        try await eventually("the dispatcher reports Redis unreachable", timeout: .seconds(5)) {
            await dispatcher.readyStatus() == 503
        }
        try await Task.sleep(until: crashedAt + .seconds(3), clock: .continuous)
        try await redis.start()
        let restartedAt = clock.now
        try await eventually("ingest is ready again", timeout: .seconds(15)) { await ingest.readyStatus() == 200 }
        let ingestRecovered = clock.now - restartedAt
        try await eventually("the dispatcher is ready again", timeout: .seconds(15)) { await dispatcher.readyStatus() == 200 }
        let dispatcherRecovered = clock.now - restartedAt
        try await Task.sleep(for: .seconds(2))
        await stream.stop()

        let tally = try await Tally.settle(stream: stream, simulator: simulator, topics: topics, timeout: .seconds(60))
        let outcomes = stream.outcomes
        // 503 only during the outage: every request sent before the crash, or once ingest said it was ready
        // again, was accepted; every refusal was a 503 answered within the Redis timeouts.
        let early = outcomes.filter { $0.value.answeredAt < crashedAt }
        #expect(early.allSatisfy { $0.value.status == 202 }, "refused before the crash")
        let late = outcomes.filter { $0.value.sentAt > restartedAt + ingestRecovered }
        #expect(!late.isEmpty && late.allSatisfy { $0.value.status == 202 }, "refused after recovery: \(late.filter { $0.value.status != 202 }.map(\.key))")
        let refusals = outcomes.filter { $0.value.status != 202 }
        #expect(!refusals.isEmpty, "no request met the outage; the test proves nothing")
        #expect(refusals.allSatisfy { $0.value.status == 503 }, "statuses \(Set(refusals.map(\.value.status)))")
        #expect(refusals.allSatisfy { $0.value.answeredAt - $0.value.sentAt < .seconds(5) }, "a 503 took too long")
        #expect(ingestRecovered < .seconds(5) && dispatcherRecovered < .seconds(5))
        // Nothing accepted is lost; nothing is dead-lettered (the dispatcher waits for Redis, it does not give up).
        #expect(tally.missing.count == 0, "missing pushes: \(tally.missing.count), first \(tally.missing.prefix(3))")
        #expect(tally.delivered == tally.owed && tally.deadLettered == 0, "\(tally)")
        #expect(tally.strangers == 0)
        // The dispatcher was never killed: a job whose offset was not yet committed is not run twice.
        #expect(tally.duplicates == 0, "\(tally.duplicates) duplicates")
        let keep = tally.missing.count > 0 || tally.strangers > 0 || !(ingest.child.isRunning && dispatcher.child.isRunning)
        #expect(ingest.child.isRunning && dispatcher.child.isRunning, "a service died: \(exitStatus(ingest.child)), \(exitStatus(dispatcher.child))")
        report("Redis outage", tally, faults: "Redis SIGKILL, 3 s down; ingest ready \(ingestRecovered), dispatcher ready "
               + "\(dispatcherRecovered) after restart", started: started)

        await dispatcher.child.stop()
        await ingest.child.stop()
        await simulator.child.stop()
        await redis.crash()
        cleanUp(directory, keep: keep)
    }
}
