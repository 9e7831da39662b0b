import Foundation
import HeraldTestSupport
import Testing

@Suite("Fault injection: dispatcher killed", .serialized)
struct FaultDispatcherKillTests {
    /// A killed member is noticed after the session timeout, and Tansu forms a group in half of it: 3 s instead
    /// of the tests' usual 6 s keeps each restart near 5 s.
    static let settings = ["HERALD_KAFKA_SESSION_TIMEOUT_SECONDS": "3"]

    /// One ingest and one dispatcher on the shared Redis and broker; the dispatcher is killed with SIGKILL three
    /// times while 40 events a second stream in, and started again (same group) each time.
    @Test("the dispatcher killed -9 three times under a steady stream: every accepted event delivered, duplicates within the bound")
    func dispatcherKilledRepeatedly() async throws {
        let started = ContinuousClock.now
        let directory = try scratchDirectory("herald-fault-kill-")
        let apps = try TestApps(count: 1)
        defer { apps.remove() }
        let redisURL = try TestEnvironment.redisURL()
        let topics = FaultTopics(brokers: try TestEnvironment.kafkaBrokers())
        let perChannel = 3, perSecond = 40, kills = 3
        let stack = try await FaultStack.start(apps: apps, redisURL: redisURL, topics: topics, directory: directory,
                                               channelCount: 16, perChannel: perChannel, dispatcherName: "dispatcher-0",
                                               dispatcherExtra: Self.settings)
        let (simulator, ingest, audience, app) = (stack.simulator, stack.ingest, stack.audience, apps.apps[0])
        var dispatcher = stack.dispatcher

        let stream = EventStream(app: app, audience: audience, targets: [ingest], perSecond: perSecond)
        stream.start()
        var rejoins: [Duration] = []
        for kill in 1...kills {
            try await Task.sleep(for: .seconds(1))
            await dispatcher.child.crash()
            try await Task.sleep(for: .milliseconds(300))
            let restartedAt = ContinuousClock.now
            dispatcher = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, redisURL: redisURL,
                                               directory: directory, name: "dispatcher-\(kill)", extra: Self.settings)
            try await dispatcher.waitForAssignment(timeout: .seconds(60))
            rejoins.append(ContinuousClock.now - restartedAt)
            // Caught up with the backlog of the outage before the next kill, so each kill hits a live stream.
            let owed = stream.accepted.count * perChannel
            try await eventually("dispatcher-\(kill) caught up", timeout: .seconds(30)) {
                simulator.acceptedCount() >= owed
            }
        }
        try await Task.sleep(for: .seconds(1))
        await stream.stop()

        let tally = try await Tally.settle(stream: stream, simulator: simulator, topics: topics, timeout: .seconds(60))
        #expect(tally.attempted > 0 && tally.accepted == tally.attempted, "ingest was never faulted: \(tally)")
        #expect(tally.missing.count == 0, "missing pushes: \(tally.missing.count), first \(tally.missing.prefix(3))")
        #expect(tally.delivered == tally.owed && tally.deadLettered == 0, "\(tally)")
        #expect(tally.strangers == 0)
        // README (delivery guarantees): after a crash, duplicates are the interrupted fan-outs (each ≤ its 3
        // tokens, well under a batch) plus jobs settled but not yet committed (commits every 100 ms). A push takes
        // milliseconds, so that is a fraction of a second of the stream per kill: one second of it is the bound.
        #expect(tally.duplicates <= kills * perSecond * perChannel, "\(tally.duplicates) duplicates")
        report("dispatcher kill -9", tally, faults: "\(kills) × SIGKILL (rejoined after \(rejoins))", started: started)

        await dispatcher.child.stop()
        await ingest.child.stop()
        await simulator.child.stop()
        cleanUp(directory, keep: tally.missing.count > 0 || tally.strangers > 0)
    }
}
