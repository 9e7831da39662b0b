import HeraldRuntime
import Testing

@Suite struct ServiceGroupTests {
    /// Records when it was cancelled and when it finished; takes `drain` to finish once cancelled.
    struct Part: Service {
        let name: String
        let drain: Duration
        let events: Lock<[String]>

        func run() async throws {
            await waitForCancellation()
            events.withLock { $0.append("\(name) cancelled") }
            // Not cut short by the cancellation: a drain that needs its time.
            await Task { try? await Task.sleep(for: drain) }.value
            events.withLock { $0.append("\(name) done") }
        }
    }

    /// A group stopped by cancelling its task (as a group inside another is) stops its services newest first,
    /// each within the grace period: the older one is cancelled only once the newer one has finished.
    @Test func aCancelledGroupStopsItsServicesNewestFirstAndWaitsForEach() async throws {
        let events = Lock<[String]>([])
        let group = ServiceGroup(services: [Part(name: "older", drain: .milliseconds(10), events: events),
                                            Part(name: "newer", drain: .milliseconds(300), events: events)],
                                 signals: [], gracePeriod: .seconds(5), logger: Logger(label: "test", minimumLevel: .error))
        let running = Task { try await group.run() }
        try await Task.sleep(for: .milliseconds(100))
        let stopping = ContinuousClock.now
        running.cancel()
        try await running.value
        #expect(events.withLock { $0 } == ["newer cancelled", "newer done", "older cancelled", "older done"])
        #expect(ContinuousClock.now - stopping >= .milliseconds(300))
    }

    /// A service that overruns the grace period does not hold the others: the next one is cancelled at the deadline.
    @Test func aServicePastTheGracePeriodDoesNotDelayTheNextOnesCancellation() async throws {
        let events = Lock<[String]>([])
        let group = ServiceGroup(services: [Part(name: "older", drain: .milliseconds(10), events: events),
                                            Part(name: "newer", drain: .seconds(1), events: events)],
                                 signals: [], gracePeriod: .milliseconds(200), logger: Logger(label: "test", minimumLevel: .error))
        let running = Task { try await group.run() }
        try await Task.sleep(for: .milliseconds(100))
        running.cancel()
        try await running.value
        let order = events.withLock { $0 }
        #expect(order.firstIndex(of: "older cancelled")! < order.firstIndex(of: "newer done")!, "\(order)")
    }
}
