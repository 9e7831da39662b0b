import HeraldRuntime

/// Works a service's readiness out in the background, one round of checks every `interval`, so that `/readyz`
/// answers from memory: probes are unauthenticated, and a flood of them must not turn into Redis and Kafka round
/// trips (a Kafka metadata request runs on the thread that also delivers publish acknowledgements).
public final class ReadinessMonitor: Service {
    /// A check's answer; each check bounds its own time.
    public typealias Check = @Sendable () async -> Bool

    private let checks: [String: Check]
    /// What a failing check reports, when not "unreachable" (a consumer still joining its group is not unreachable).
    private let failures: [String: String]
    private let interval: Duration
    /// Every check "unknown" until the first round ends (a fraction of a second after start).
    private let latest: Lock<[String: String]>
    private let rounds: CounterFamily

    public init(checks: [String: Check], failures: [String: String] = [:], interval: Duration = .seconds(1),
                metrics: MetricsRegistry = .shared) {
        self.checks = checks
        self.failures = failures
        self.interval = interval
        rounds = metrics.counter("herald_readiness_rounds_total", help: "Rounds of readiness checks run (one a second).")
        latest = Lock(checks.mapValues { _ in "unknown" })
    }

    /// Each check's last answer: "ok", "unknown", or its failure ("unreachable" unless `failures` says otherwise).
    public var results: [String: String] { latest.withLock { $0 } }

    /// Runs a round now, then one every `interval` until cancelled.
    public func run() async throws {
        while !Task.isCancelled {
            await checkOnce()
            try? await Task.sleep(for: interval)
        }
    }

    /// One round: the checks run concurrently and their answers replace the last round's together.
    public func checkOnce() async {
        let checks = self.checks, failures = self.failures
        let results = await withTaskGroup(of: (String, Bool).self) { group in
            for (name, check) in checks { group.addTask { (name, await check()) } }
            var results: [String: String] = [:]
            for await (name, ok) in group { results[name] = ok ? "ok" : failures[name] ?? "unreachable" }
            return results
        }
        latest.withLock { $0 = results }
        rounds.increment()
    }
}
