import Foundation
import HeraldCrypto
import HeraldRuntime
import HeraldStore
import HeraldTestSupport
import Testing

@Suite("Fault injection: Redis Cluster failover", .serialized)
struct FaultRedisFailoverTests {
    /// A cluster of the test's own (3 masters, 3 replicas, 2 s node timeout) under one ingest and one dispatcher;
    /// the master serving the app's own keys (an event's job status and idempotency marker) is killed with SIGKILL
    /// while 40 events a second stream in. Its replica takes over; neither service is restarted. A second app whose
    /// keys and credential are served by other masters streams 10 events a second throughout: none of its requests
    /// is refused (its channels may be on the killed master: their pushes wait for the promotion).
    @Test("a Redis Cluster master killed under load: 503 only for the failover window, then served by the promoted replica, no accepted event lost")
    func masterFailover() async throws {
        let started = ContinuousClock.now
        let directory = try scratchDirectory("herald-fault-failover-")
        // The chance that no other app has both its keys and its secret key's rate limits on another master: (5/9)^15.
        let apps = try TestApps(count: 16)
        defer { apps.remove() }
        let cluster = try TestRedisCluster(directory: directory)
        try await cluster.start()
        let topics = FaultTopics(brokers: try TestEnvironment.kafkaBrokers())
        let stack = try await FaultStack.start(apps: apps, redisURL: cluster.url, topics: topics, directory: directory,
                                               channelCount: 16, perChannel: 3)
        let (simulator, ingest, dispatcher, audience) = (stack.simulator, stack.ingest, stack.dispatcher, stack.audience)
        let app = apps.apps[0]
        let victim = try await cluster.master(ofKey: "herald:{\(app.id)}:x")
        var bystanderApp: TestApps.Entry?
        for other in apps.apps.dropFirst() {
            // An event writes the app's keys (job status, idempotency) and counts in its credential's slot.
            let credential = "herald:{\(other.id):k:key:" + Hex.encode(SHA256.hash(Array(other.secretKey.utf8))) + "}:x"
            if try await cluster.master(ofKey: "herald:{\(other.id)}:x") != victim,
               try await cluster.master(ofKey: credential) != victim {
                bystanderApp = other
                break
            }
        }
        let bystander = try #require(bystanderApp, "every app on the victim's master: run again")
        let bystanderAudience = try await Audience.subscribe(app: bystander, through: ingest, channelCount: 4, perChannel: 2)

        let stream = EventStream(app: app, audience: audience, targets: [ingest], perSecond: 40)
        let bystanderStream = EventStream(app: bystander, audience: bystanderAudience, targets: [ingest], perSecond: 10)
        stream.start()
        bystanderStream.start()
        try await Task.sleep(for: .seconds(2))
        let clock = ContinuousClock()
        let killedAt = clock.now
        await cluster.crash(port: victim)
        // Readiness asks any master that answers: one master failing over does not take ingest out of service.
        let readiness = Task {
            var statuses: [Int] = []
            while !Task.isCancelled {
                statuses.append(await ingest.readyStatus())
                try? await Task.sleep(for: .milliseconds(250))
            }
            return statuses
        }
        try await eventually("a replica took over the slot", timeout: .seconds(20)) {
            (try? await cluster.master(ofKey: "herald:{\(app.id)}:x")).map { $0 != victim } ?? false
        }
        let promotedAfter = clock.now - killedAt
        readiness.cancel()
        let readyStatuses = await readiness.value
        #expect(readyStatuses.count >= 4 && readyStatuses.allSatisfy { $0 == 200 }, "ingest /readyz during the failover: \(readyStatuses)")
        // Traffic after the window: long enough to see every request succeed again.
        try await Task.sleep(for: .seconds(6))
        await stream.stop()
        await bystanderStream.stop()

        let tally = try await Tally.settle(stream: stream, simulator: simulator, topics: topics, timeout: .seconds(60))
        let outcomes = stream.outcomes
        let refusals = outcomes.filter { $0.value.status != 202 }
        #expect(!refusals.isEmpty, "no request met the failover; the test proves nothing")
        #expect(refusals.allSatisfy { $0.value.status == 503 }, "statuses \(Set(refusals.map(\.value.status)))")
        #expect(refusals.allSatisfy { $0.value.answeredAt - $0.value.sentAt < .seconds(5) }, "a 503 took too long")
        let lastRefusal = refusals.map(\.value.answeredAt).max() ?? killedAt
        let window = lastRefusal - killedAt
        #expect(window <= .seconds(15), "503s for \(window) after the kill")
        #expect(outcomes.filter { $0.value.answeredAt < killedAt }.allSatisfy { $0.value.status == 202 })
        let late = outcomes.filter { $0.value.sentAt > lastRefusal }
        #expect(late.count >= 100 && late.allSatisfy { $0.value.status == 202 }, "served again without a restart")
        // The subscriptions were replicated before the kill: the promoted replica has them all, so every accepted
        // event reaches its whole audience.
        #expect(tally.missing.count == 0, "missing pushes: \(tally.missing.count), first \(tally.missing.prefix(3))")
        #expect(tally.delivered == tally.owed && tally.deadLettered == 0, "\(tally)")
        #expect(tally.strangers == 0)
        #expect(ingest.child.isRunning && dispatcher.child.isRunning, "a service died")
        // The other master's app: every request accepted, every push delivered.
        let bystanderOutcomes = bystanderStream.outcomes
        #expect(bystanderOutcomes.count >= 80 && bystanderOutcomes.allSatisfy { $0.value.status == 202 },
                "the other app was refused: \(bystanderOutcomes.filter { $0.value.status != 202 }.map { "\($0.value.status) at \($0.value.sentAt - killedAt)" })")
        let bystanderOwed = Set(bystanderStream.accepted.flatMap { n in
            bystanderAudience.tokens(ofEvent: n).map { Owed(n: n, token: $0) } })
        try await eventually("the other app's pushes delivered", timeout: .seconds(30)) {
            let seen = Set(simulator.accepted().compactMap { record -> Owed? in
                guard let n = record["payload"]?["n"]?.numberValue, let token = record["token"]?.stringValue else { return nil }
                return Owed(n: Int(n), token: token)
            })
            return bystanderOwed.isSubset(of: seen)
        }
        report("Redis Cluster failover", tally, faults: "master SIGKILL, replica promoted after \(promotedAfter), "
               + "503s for \(window)", started: started)

        await dispatcher.child.stop()
        await ingest.child.stop()
        await simulator.child.stop()
        await cluster.stop()
        cleanUp(directory, keep: tally.missing.count > 0 || bystanderOutcomes.contains { $0.value.status != 202 })
    }
}

extension FaultRedisFailoverTests {
    /// One channel of 30 subscribers on the test's own cluster. Round after round one subscriber unsubscribes, an
    /// event goes to the channel and is waited for until its job is done, and the subscriber subscribes again; the
    /// master serving the first subscriber's device slot is killed with SIGKILL after 3 s. No push of an event
    /// accepted after an acknowledged unsubscribe (and done before the subscriber came back) reaches it, every
    /// other subscriber receives every event, and afterwards all 30 receive again (what a failed removal left half
    /// done was repaired by the subscriber's next subscribe).
    @Test("subscriptions removed and re-added while a master is killed: no push to a removed subscription, none lost")
    func removeAndReAddUnderAKill() async throws {
        let directory = try scratchDirectory("herald-fault-readd-")
        let apps = try TestApps(count: 1)
        defer { apps.remove() }
        let cluster = try TestRedisCluster(directory: directory)
        try await cluster.start()
        let topics = FaultTopics(brokers: try TestEnvironment.kafkaBrokers())
        let stack = try await FaultStack.start(apps: apps, redisURL: cluster.url, topics: topics, directory: directory,
                                               channelCount: 1, perChannel: 30)
        let (simulator, ingest, app) = (stack.simulator, stack.ingest, apps.apps[0])
        let channel = stack.audience.channels[0], tokens = stack.audience.tokens[0]
        let victim = try await cluster.master(ofKey: "herald:{\(app.id):d:\(tokens[0])}:x")
        let subscriptions = "/v1/apps/\(app.id)/subscriptions"
        func subscription(_ token: String) -> String {
            #"{"channel": "\#(channel)", "deviceToken": "\#(token)", "tokenType": "alert"}"#
        }
        /// Sends until answered 2xx (503s while the slot fails over), at most 30 s.
        func untilAccepted(_ method: String, _ path: String, key: String, json: String) async throws -> RawHTTPClient.Response {
            let deadline = ContinuousClock.now + .seconds(30)
            while true {
                if let response = try? await ingest.request(method, path, key: key, json: json),
                   (200...299).contains(response.status) { return response }
                try #require(ContinuousClock.now < deadline, "\(method) \(path) not accepted within 30 s")
                try await Task.sleep(for: .milliseconds(100))
            }
        }
        /// The tokens each event's pushes reached, by the event's `n`.
        @Sendable func pushes() -> [Int: Set<String>] {
            var reached: [Int: Set<String>] = [:]
            for record in simulator.accepted() {
                guard let n = record["payload"]?["n"]?.numberValue, let token = record["token"]?.stringValue else { continue }
                reached[Int(n), default: []].insert(token)
            }
            return reached
        }

        struct Round { var n: Int; var removed: String?; var token: String }
        var rounds: [Round] = [], refusedRemovals = 0
        let clock = ContinuousClock()
        let begin = clock.now
        var killedAt: ContinuousClock.Instant?
        var n = 0
        while clock.now - begin < .seconds(16) {
            var justKilled = false
            if killedAt == nil, clock.now - begin >= .seconds(3) {
                killedAt = clock.now
                await cluster.crash(port: victim)
                justKilled = true
            }
            // Right after the kill, the token whose record is on the killed master: that removal meets the failover
            // whichever token the rounds had come to (others' slots may be on masters that stayed up).
            let token = justKilled ? tokens[0] : tokens[n % tokens.count]
            let removal = try? await ingest.request("DELETE", subscriptions, key: app.publicKey, json: subscription(token))
            let removed = removal?.status == 200 && (try? removal?.json()["removed"] as? Int) == 1
            if !removed { refusedRemovals += 1 }
            let event = try await untilAccepted("POST", "/v1/apps/\(app.id)/events", key: app.secretKey, json: """
                {"channel": "\(channel)", "id": "readd-\(n)", "alert": {"aps": {"alert": {"title": "event \(n)"}}, "n": \(n)}}
                """)
            let jobID = try #require(JSONValue(parsing: event.body)?["jobId"]?.stringValue)
            try await eventually("job \(n) done", timeout: .seconds(30)) {
                let status = try? await ingest.request("GET", "/v1/apps/\(app.id)/jobs/\(jobID)", key: app.secretKey)
                return status.flatMap { JSONValue(parsing: $0.body)?["state"]?.stringValue } == "done"
            }
            _ = try await untilAccepted("POST", subscriptions, key: app.publicKey, json: subscription(token))
            rounds.append(Round(n: n, removed: removed ? token : nil, token: token))
            n += 1
        }
        try #require(killedAt != nil && rounds.count >= 20, "\(rounds.count) rounds")
        #expect(refusedRemovals > 0, "no removal met the failover; the test proves nothing")
        #expect(refusedRemovals < rounds.count, "no removal succeeded")

        // A last event after every subscriber came back, so every push of the rounds has had its chance to arrive.
        let last = rounds.count
        _ = try await untilAccepted("POST", "/v1/apps/\(app.id)/events", key: app.secretKey, json: """
            {"channel": "\(channel)", "id": "readd-\(last)", "alert": {"aps": {"alert": {"title": "last"}}, "n": \(last)}}
            """)
        try await eventually("the last event reached all 30", timeout: .seconds(30)) { pushes()[last] == Set(tokens) }
        let reachedByEvent = pushes()
        var toRemoved: [Int] = [], lost: [Int] = []
        for round in rounds {
            let reached = reachedByEvent[round.n] ?? []
            if let removed = round.removed, reached.contains(removed) { toRemoved.append(round.n) }
            if !reached.isSuperset(of: Set(tokens).subtracting([round.token])) { lost.append(round.n) }
        }
        #expect(toRemoved.isEmpty, "events pushed to a subscription whose removal was acknowledged: \(toRemoved)")
        #expect(lost.isEmpty, "events that missed a subscriber: \(lost)")
        print("remove and re-add under a kill: \(rounds.count) rounds, \(refusedRemovals) removals refused (503) during the failover")
        #expect(stack.ingest.child.isRunning && stack.dispatcher.child.isRunning, "a service died")

        await stack.dispatcher.child.stop()
        await ingest.child.stop()
        await simulator.child.stop()
        await cluster.stop()
        cleanUp(directory, keep: !toRemoved.isEmpty || !lost.isEmpty)
    }
}

extension FaultRedisFailoverTests {
    /// A fan-out to 1,000 subscribers, slowed to about 5 s (20 pushes in flight, batches of 50, the simulator
    /// answering after 100 ms), meets a failover of the master holding the channel's index (`CLUSTER FAILOVER` on
    /// its replica: nothing is lost). The promoted replica is another Redis process, which hashes the index with a
    /// seed of its own: a scan going on there from the old master's cursor skips subscribers (a few hundred, here).
    /// Every subscriber gets the push, and the dispatcher counts the scan it started again.
    @Test("a channel's master failing over mid-fan-out: the scan starts again and every subscriber gets the push")
    func fanOutAcrossAFailover() async throws {
        let directory = try scratchDirectory("herald-fault-scan-")
        let apps = try TestApps(count: 1)
        defer { apps.remove() }
        let cluster = try TestRedisCluster(directory: directory)
        try await cluster.start()
        let topics = FaultTopics(brokers: try TestEnvironment.kafkaBrokers())
        let count = 1_000
        let stack = try await FaultStack.start(apps: apps, redisURL: cluster.url, topics: topics, directory: directory,
                                               channelCount: 1, perChannel: count, rules: [.object(["delayMs": .number(100)])],
                                               dispatcherExtra: ["HERALD_MAX_IN_FLIGHT_PUSHES": "20",
                                                                 "HERALD_FANOUT_BATCH_SIZE": "50"])
        let (simulator, ingest, dispatcher, app) = (stack.simulator, stack.ingest, stack.dispatcher, apps.apps[0])
        let channel = stack.audience.channels[0]
        let index = RedisKeys(app: app.id).channel(channel)
        let master = try await cluster.master(ofKey: index)

        let event = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey,
                                             json: #"{"channel": "\#(channel)", "alert": {"aps": {"alert": "sale"}}}"#)
        try #require(event.status == 202, "\(event.text)")
        try await eventually("a fifth of the fan-out delivered", timeout: .seconds(60)) { simulator.acceptedCount() >= count / 5 }
        try await cluster.failOver(master: master)
        let beforeFailover = simulator.acceptedCount()
        #expect(beforeFailover < count * 4 / 5, "the fan-out was nearly done before the failover; the test proves little")
        #expect(try await cluster.master(ofKey: index) != master, "the replica did not take over")

        let tokens = Set(stack.audience.tokens[0])
        try? await eventually("every subscriber got the push", timeout: .seconds(60)) {
            Set(simulator.accepted().compactMap { $0["token"]?.stringValue }).isSuperset(of: tokens)
        }
        let accepted = simulator.accepted().compactMap { $0["token"]?.stringValue }
        #expect(tokens.subtracting(accepted).isEmpty, "\(tokens.subtracting(accepted).count) subscribers never got the push")
        #expect(await dispatcher.metric("herald_dispatcher_fanout_rescans_total") ?? 0 >= 1, "no scan started again")
        print("fan-out across a failover: \(beforeFailover) of \(count) delivered before it, \(accepted.count - Set(accepted).count) sent twice")

        await dispatcher.child.stop()
        await ingest.child.stop()
        await simulator.child.stop()
        await cluster.stop()
        cleanUp(directory, keep: !Set(accepted).isSuperset(of: tokens))
    }
}

/// Six redis-servers of the test's own in cluster mode: 3 masters, 3 replicas, a 2 s node timeout (failover in
/// a few seconds), append-only files so a replica holds what its master acknowledged, and
/// `cluster-require-full-coverage no` (README) so the other masters keep serving while one fails over.
final class TestRedisCluster: Sendable {
    let ports: [UInt16]
    private let busPorts: [UInt16]
    let directory: String
    private let processes = Lock<[UInt16: ChildProcess]>([:])

    init(directory: String) throws {
        ports = try (0..<6).map { _ in try freePort() }
        busPorts = try (0..<6).map { _ in try freePort() }
        self.directory = directory + "/cluster"
    }

    /// Two seeds, as a user would give them.
    var url: String { "redis://" + ports.prefix(2).map { "127.0.0.1:\($0)" }.joined(separator: ",") + "/0" }

    func start() async throws {
        for (port, bus) in zip(ports, busPorts) {
            let folder = "\(directory)/\(port)"
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            let child = try ChildProcess("redis-\(port)", executable: "/usr/bin/redis-server", arguments: [
                "--bind", "127.0.0.1", "--port", "\(port)", "--cluster-enabled", "yes", "--cluster-port", "\(bus)",
                "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no", "--dir", folder,
                "--save", "", "--appendonly", "yes", "--daemonize", "no",
                // Its own file, not the test run's log folder: cluster logs name nodes by 40-hex-digit ids, which
                // the token scan of Herald's logs would take for push tokens.
                "--logfile", folder + "/redis.log",
            ], environment: [:], logPath: folder + "/stdout.log")
            processes.withLock { $0[port] = child }
        }
        for port in ports {
            try await eventually("redis-server answers on \(port)", timeout: .seconds(10)) {
                (try? runTool("redis-cli", ["-p", "\(port)", "ping"]))?.contains("PONG") == true
            }
        }
        _ = try runTool("redis-cli", ["--cluster", "create"] + ports.map { "127.0.0.1:\($0)" }
                        + ["--cluster-replicas", "1", "--cluster-yes"])
        try await eventually("the cluster is up with a replica per master", timeout: .seconds(30)) {
            for port in ports {
                guard let info = try? runTool("redis-cli", ["-p", "\(port)", "INFO", "replication"]),
                      let state = try? runTool("redis-cli", ["-p", "\(port)", "CLUSTER", "INFO"]),
                      state.contains("cluster_state:ok"),
                      info.contains("role:master") ? info.contains("connected_slaves:1")
                                                   : info.contains("master_link_status:up") else { return false }
            }
            return true
        }
    }

    /// The port of the master serving `key`'s slot, as a live node sees it.
    func master(ofKey key: String) async throws -> UInt16 {
        let live = processes.withLock { $0 }.filter { $0.value.isRunning }.keys.sorted()
        for port in live {
            guard let slot = Int((try? runTool("redis-cli", ["-p", "\(port)", "CLUSTER", "KEYSLOT", key]))?
                    .trimmingCharacters(in: .whitespacesAndNewlines) ?? ""),
                  let nodes = try? runTool("redis-cli", ["-p", "\(port)", "CLUSTER", "NODES"]) else { continue }
            if let master = ClusterMaster.parse(clusterNodes: nodes).first(where: { $0.serves(slot) }) {
                return UInt16(master.port)
            }
        }
        throw TestRedisClusterError(description: "no live node names a master for \(key)")
    }

    /// A manual failover (`CLUSTER FAILOVER` on the master's replica: the two agree on the replication offset first,
    /// so nothing acknowledged is lost); returns once the replica serves the master's slots.
    func failOver(master port: UInt16) async throws {
        let replication = try runTool("redis-cli", ["-p", "\(port)", "INFO", "replication"])
        guard let line = replication.split(whereSeparator: \.isNewline).first(where: { $0.hasPrefix("slave0:") }),
              let field = line.split(separator: ",").first(where: { $0.hasPrefix("port=") }),
              let replica = UInt16(field.dropFirst(5)) else {
            throw TestRedisClusterError(description: "no replica of \(port): \(replication)")
        }
        _ = try runTool("redis-cli", ["-p", "\(replica)", "CLUSTER", "FAILOVER"])
        try await eventually("\(replica) took over from \(port)", timeout: .seconds(20)) {
            (try? runTool("redis-cli", ["-p", "\(replica)", "ROLE"]))?.hasPrefix("master") == true
        }
    }

    func crash(port: UInt16) async {
        await processes.withLock { $0.removeValue(forKey: port) }?.crash()
    }

    func stop() async {
        for child in processes.withLock({ p in defer { p = [:] }; return Array(p.values) }) { await child.crash() }
    }
}

struct TestRedisClusterError: Error, CustomStringConvertible {
    let description: String
}
