import Foundation
import HeraldRuntime
import HeraldTestSupport
import Testing

/// `/readyz` is unauthenticated, so anyone who reaches the port can call it as fast as they like. It is answered
/// from the last round of checks (one a second), so a flood neither reaches Redis or Kafka nor slows intake.
@Suite(.serialized) struct ReadinessFloodTests {
    @Test func aReadinessFloodRunsNoChecksAndEventsAreStillAccepted() async throws {
        let ingest = try await ReliabilityIngest()
        let app = ingest.apps.apps[0]
        let port = ingest.port
        let roundsBefore = try await Self.rounds(port)
        let flooding = Lock(true)
        let started = ContinuousClock.now

        // Four keep-alive connections, each asking up to 2,000 times a second: thousands of times the rate of checks.
        // Not as fast as answered: on this 2-core box that starves Redis and the producer below of CPU (a Redis
        // reply once took over 2 s), which says nothing about whether probes run checks.
        let probes = Task {
            try await withThrowingTaskGroup(of: [Int: Int].self) { group in
                for _ in 0..<4 {
                    group.addTask {
                        try await onThread {
                            let client = try RawHTTPClient(port: port, timeout: 5)
                            var statuses: [Int: Int] = [:]
                            while flooding.withLock({ $0 }) {
                                statuses[try client.request("GET", "/readyz").status, default: 0] += 1
                                Thread.sleep(forTimeInterval: 0.0005)
                            }
                            return statuses
                        }
                    }
                }
                return try await group.reduce(into: [:]) { total, part in total.merge(part, uniquingKeysWith: +) }
            }
        }
        // Meanwhile a producer sends 20 events a second for 5 s.
        var eventStatuses: [Int] = []
        for index in 0..<100 {
            let response = try await ingest.request("POST", "/v1/apps/\(app.id)/events", headers: ["X-API-Key": app.secretKey],
                                                    json: #"{"channel": "flood-\#(index)", "alert": {"aps": {"alert": "hi"}}}"#)
            eventStatuses.append(response.status)
            try await Task.sleep(for: .milliseconds(50))
        }
        flooding.withLock { $0 = false }
        let probeStatuses = try await probes.value
        let elapsed = ContinuousClock.now - started
        let rounds = try await Self.rounds(port) - roundsBefore

        let probeCount = probeStatuses.values.reduce(0, +)
        print("[readiness] \(probeCount) probes in \(elapsed.ms) ms (\(probeStatuses)); \(rounds) rounds of checks; events \(Dictionary(grouping: eventStatuses) { $0 }.mapValues(\.count))")
        #expect(probeCount >= 1000, "the flood was too thin to mean anything")
        #expect(probeStatuses.keys.allSatisfy { $0 == 200 }, "\(probeStatuses)")
        #expect(eventStatuses.allSatisfy { $0 == 202 }, "\(eventStatuses)")
        #expect(Double(rounds) <= elapsed.inSeconds + 2, "\(rounds) rounds in \(elapsed): probes ran checks")
        await ingest.stop()
    }

    private static func rounds(_ port: UInt16) async throws -> Double {
        let text = try await onThread { try RawHTTPClient(port: port).request("GET", "/metrics").text }
        return try #require(metricValue(text, "herald_readiness_rounds_total"))
    }
}
