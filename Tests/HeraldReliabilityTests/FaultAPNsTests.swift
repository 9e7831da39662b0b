import Foundation
import HeraldRuntime
import HeraldTestSupport
import Testing

@Suite("Fault injection: APNs misbehaving", .serialized)
struct FaultAPNsTests {
    /// Token kinds by first hex digits; ordinary tokens start with `b`, so no rule matches them by chance.
    enum Kind: String, CaseIterable {
        case ordinary = "b"
        case unavailable = "a0" // 503 on every attempt: dead-lettered
        case serverError = "a1" // 500 twice, then delivered
        case throttled = "a2" // 429 three times, then delivered
        case reset = "a3" // the connection reset once, then delivered
        case stalled = "a4" // no answer past the 10 s request timeout once, then delivered
    }

    /// Five tokens per channel: ordinary, 500, 429, reset, and the last one 503-for-good on channels 0–1, stalled on
    /// channels 2–3, ordinary elsewhere.
    static func kind(channel: Int, slot: Int) -> Kind {
        switch slot {
        case 1: .serverError
        case 2: .throttled
        case 3: .reset
        case 4: channel < 2 ? .unavailable : channel < 4 ? .stalled : .ordinary
        default: .ordinary
        }
    }

    static let goaway: JSONValue = .object(["goawayAfterStreams": .number(40), "goawayReason": .string("Shutdown")])

    static func fail(_ status: Int, _ reason: String, prefix: String? = nil, times: Int? = nil) -> JSONValue {
        var rule: [String: JSONValue] = ["status": .number(Double(status)), "reason": .string(reason)]
        if let prefix { rule["tokenPrefix"] = .string(prefix) }
        if let times { rule["times"] = .number(Double(times)) }
        return .object(rule)
    }

    /// One ingest and one dispatcher (shared Redis and broker, the default 10 s APNs request timeout, 5 attempts)
    /// under 50 events a second to 20 channels of 5 tokens. First 4 s of bursts, with GOAWAY after every 40
    /// streams of a connection: every push answered 503, 500 or 429 for 250 ms out of each 500 ms. Then 3 s of
    /// per-token faults (see `Kind`), and 1.5 s of stalls (the first push to each stalled token is answered after
    /// 10.5 s) with the 503-for-good tokens still refused.
    @Test("GOAWAY, resets, stalls past the request timeout and 500/503/429 bursts under load: every push delivered or dead-lettered, none hanging, memory flat")
    func apnsFaults() async throws {
        let started = ContinuousClock.now
        let directory = try scratchDirectory("herald-fault-apns-")
        let apps = try TestApps(count: 1)
        defer { apps.remove() }
        let redisURL = try TestEnvironment.redisURL()
        let topics = FaultTopics(brokers: try TestEnvironment.kafkaBrokers())
        let stack = try await FaultStack.start(apps: apps, redisURL: redisURL, topics: topics, directory: directory,
                                               channelCount: 20, perChannel: 5, rules: [Self.goaway]) {
            Self.kind(channel: $0, slot: $1).rawValue
        }
        let (simulator, ingest, dispatcher, audience) = (stack.simulator, stack.ingest, stack.dispatcher, stack.audience)
        let app = apps.apps[0]

        let stream = EventStream(app: app, audience: audience, targets: [ingest], perSecond: 50)
        stream.start()
        // Warm-up: connections open, caches filled; the RSS baseline is taken after it.
        try await Task.sleep(for: .seconds(1))
        let baseline = try #require(residentBytes(dispatcher.child.pid))
        var peak = baseline

        let bursts = [Self.fail(503, "ServiceUnavailable"), Self.fail(500, "InternalServerError"),
                      Self.fail(429, "TooManyRequests")]
        for round in 0..<8 {
            try simulator.setRules([Self.goaway, bursts[round % bursts.count]])
            try await Task.sleep(for: .milliseconds(250))
            try simulator.setRules([Self.goaway])
            try await Task.sleep(for: .milliseconds(250))
            peak = max(peak, residentBytes(dispatcher.child.pid) ?? 0)
        }
        // No GOAWAY in these phases, and stalls come last on their own: a GOAWAY or a reset would close a
        // stalled stream's connection before the request timeout.
        let unavailable = Self.fail(503, "ServiceUnavailable", prefix: Kind.unavailable.rawValue)
        try simulator.setRules([
            unavailable,
            Self.fail(500, "InternalServerError", prefix: Kind.serverError.rawValue, times: 2),
            Self.fail(429, "TooManyRequests", prefix: Kind.throttled.rawValue, times: 3),
            .object(["tokenPrefix": .string(Kind.reset.rawValue), "reset": .bool(true), "times": .number(1)]),
        ])
        let perTokenFrom = ContinuousClock.now + .milliseconds(200) // the simulator re-reads within 100 ms
        for _ in 0..<6 {
            try await Task.sleep(for: .milliseconds(500))
            peak = max(peak, residentBytes(dispatcher.child.pid) ?? 0)
        }
        try simulator.setRules([
            unavailable, .object(["tokenPrefix": .string(Kind.stalled.rawValue), "delayMs": .number(10_500), "times": .number(1)]),
        ])
        let stallFrom = ContinuousClock.now + .milliseconds(200)
        try await Task.sleep(for: .seconds(1.5))
        await stream.stop()

        let tally = try await Tally.settle(stream: stream, simulator: simulator, topics: topics, timeout: .seconds(60))
        #expect(tally.attempted > 0 && tally.accepted == tally.attempted, "\(tally)")
        #expect(tally.missing.count == 0, "neither delivered nor dead-lettered: \(tally.missing.count), first \(tally.missing.prefix(3))")
        #expect(tally.strangers == 0)
        // The tokens APNs refuses for good in the per-token phase are dead-lettered, every other kind eventually
        // delivered: a stalled request timed out and was retried, a reset connection replaced.
        let outcomes = stream.outcomes
        let perTokenEvents = outcomes.filter { $0.value.sentAt > perTokenFrom && $0.value.status == 202 }.map(\.key)
        let stallEvents = Set(outcomes.filter { $0.value.sentAt > stallFrom }.map(\.key))
        let delivered = Set(simulator.accepted().compactMap { record -> Owed? in
            guard let n = record["payload"]?["n"]?.numberValue, let token = record["token"]?.stringValue else { return nil }
            return Owed(n: Int(n), token: token)
        })
        var owedPerKind: [Kind: [Owed]] = [:]
        for n in perTokenEvents {
            for (slot, token) in audience.tokens(ofEvent: n).enumerated() {
                let kind = Self.kind(channel: n % audience.channels.count, slot: slot)
                if kind == .stalled, !stallEvents.contains(n) { continue } // stalls only in the last phase
                owedPerKind[kind, default: []].append(Owed(n: n, token: token))
            }
        }
        #expect(owedPerKind[.unavailable, default: []].allSatisfy { !delivered.contains($0) })
        #expect(!owedPerKind[.stalled, default: []].isEmpty)
        for kind in Kind.allCases where kind != .unavailable {
            let owed = owedPerKind[kind, default: []]
            #expect(owed.allSatisfy { delivered.contains($0) }, "\(kind): \(owed.filter { !delivered.contains($0) }.count) of \(owed.count) not delivered")
        }
        #expect(tally.deadLettered >= owedPerKind[.unavailable, default: []].count && tally.deadLettered > 0)
        // None hanging: nothing in flight once everything settled.
        try await eventually("the dispatcher has nothing in flight", timeout: .seconds(10)) {
            let jobs = await dispatcher.metric("herald_dispatcher_in_flight_jobs")
            let pushes = await dispatcher.metric("herald_dispatcher_in_flight_pushes")
            return jobs == 0 && pushes == 0
        }
        // Memory flat: what retries, reconnects and timeouts keep is bounded; a generous margin over the warm-up.
        let end = try #require(residentBytes(dispatcher.child.pid))
        peak = max(peak, end)
        #expect(end <= baseline + 48 << 20, "RSS \(baseline >> 20) MiB after warm-up, \(end >> 20) MiB at the end")
        let metrics = try await dispatcher.get("/metrics").text
        let retries = metrics.split(separator: "\n").filter { $0.hasPrefix("herald_dispatcher_retries_total{") }
            .map { $0.dropFirst("herald_dispatcher_retries_total".count) }.joined(separator: " ")
        let reconnects = Int(metricValue(metrics, "herald_apns_reconnects_total") ?? 0)
        let timeouts = metricValue(metrics, "herald_dispatcher_retries_total", labels: ["reason": "timeout"]) ?? 0
        #expect(timeouts > 0, "no request outlived the timeout; the stall proves nothing")
        report("APNs faults", tally, faults: "8 bursts (503/500/429) with GOAWAY every 40 streams, then per-token 503/500/429/reset/"
               + "stall; retries \(retries), \(reconnects) reconnects; dispatcher RSS "
               + "\(baseline >> 20) → peak \(peak >> 20) → end \(end >> 20) MiB", started: started)

        await dispatcher.child.stop()
        await ingest.child.stop()
        await simulator.child.stop()
        cleanUp(directory, keep: tally.missing.count > 0 || tally.strangers > 0)
    }
}
