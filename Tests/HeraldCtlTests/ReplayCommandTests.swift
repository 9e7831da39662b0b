import Foundation
import HeraldCore
import HeraldCrypto
import HeraldRedis
import HeraldRuntime
import HeraldStore
import HeraldTestSupport
import Testing

@Suite("heraldctl replay", .serialized)
struct ReplayCommandTests {
    @Test("re-publishes matching dead letters as valid device jobs marked replayOf, once; skips removed tokens and letters the dispatchers did not sign")
    func replayOnce() async throws {
        let harness = try await CtlHarness.make()
        defer { Task { await harness.close() } }
        let registered = (0..<4).map { _ in SecureRandom.hex(32) }
        for token in registered.prefix(3) { try await harness.subscribe(token) }
        // The fourth has only a Live Activity registration (index scored by expiry), still valid.
        let expiry = String(Int64(Date().timeIntervalSince1970 * 1000) + 600_000)
        _ = try await harness.redis.command(["ZADD", RedisKeys(app: harness.app).activityToken(registered[3]), expiry, "reg1"])
        let removed = SecureRandom.hex(32)
        let expired = SecureRandom.hex(32)
        _ = try await harness.redis.command(["ZADD", RedisKeys(app: harness.app).activityToken(expired), "1000", "reg2"])
        let letters = registered.map { harness.deadLetter(token: $0) }
            + [harness.deadLetter(token: removed), harness.deadLetter(token: expired),
               harness.deadLetter(token: nil, reason: "invalid_job", status: nil)]
        let reports = try await harness.publish(letters)
        // Letters for a registered token that someone else wrote to the topic: unsigned, or signed with another secret.
        let forged = [harness.deadLetter(token: registered[0]), harness.deadLetter(token: registered[1])]
        try await harness.publish([forged[0]], signed: false)
        try await harness.publish([forged[1]], secret: try SharedSecret(bytes: SecureRandom.bytes(32)))

        let first = try await harness.heraldctl(["replay", "--json"])
        #expect(first.status == 3, "skipped tokens: exit 3\n\(first.stdout)\n\(first.stderr)")
        let summary = try first.json()
        #expect(summary["republished"]?.numberValue == 4)
        #expect(summary["matched"]?.numberValue == 9)
        #expect(summary["skipped"] == .object(["token_removed": .number(2), "not_replayable": .number(1),
                                               "unsigned": .number(2)]))
        #expect(summary["failed"]?.numberValue == 0)
        let name = try #require(summary["replay"]?.stringValue)

        let jobs = try await harness.jobs(count: 4)
        #expect(jobs.count == 4)
        try validateAgainstSchema(jobs.map(\.bytes), schema: "push-job.schema.json")
        for (index, token) in registered.enumerated() {
            let letter = letters[index], report = reports[index]
            let matching = jobs.filter { $0.job.target.deviceToken == token }
            #expect(matching.count == 1)
            guard let (job, _, key) = matching.first else { continue }
            #expect(job.id == "replay-\(name)-\(report.partition)-\(report.offset)")
            #expect(job.replayOf == PushJob.ReplayOf(jobId: letter.jobId!, dlqPartition: report.partition, dlqOffset: report.offset))
            #expect(job.target.kind == .device && job.target.environment == .sandbox && job.target.tokenType == .alert)
            #expect(job.target.topic == letter.topic)
            #expect(job.payload == letter.payload && job.pushType == "alert" && job.priority == 10)
            #expect(key == "\(harness.app)/device/\(SHA256.hex(token))", "a key names the device by a hash of its token")
            #expect(throws: Never.self) { try job.validate() }
        }
        #expect(!jobs.contains { $0.job.target.deviceToken == removed || $0.job.target.deviceToken == expired })

        let again = try await harness.heraldctl(["replay", "--json"])
        #expect(again.status == 3)
        let second = try again.json()
        #expect(second["replay"]?.stringValue == name, "the same filters are the same replay")
        #expect(second["republished"]?.numberValue == 0)
        #expect(second["alreadyRepublished"]?.numberValue == 4)
        #expect(try await harness.jobs(count: 4).count == 4, "a second run sends nothing")

        let text = try await harness.heraldctl(["replay", "--include-removed", "--name", name])
        #expect(text.status == 3, "the invalid job still cannot be replayed")
        #expect(summaryValue(text.stdout, "re-published") == 2)
        #expect(text.stdout.contains("not_replayable"))
        #expect(try await harness.jobs(count: 6).count == 6)

        // Letters from before dispatchers signed theirs, once the operator checked them.
        let unsigned = try await harness.heraldctl(["replay", "--include-unsigned", "--name", name, "--json"])
        #expect(try unsigned.json()["republished"]?.numberValue == 2, "\(unsigned.stdout)")
        #expect(try await harness.jobs(count: 8).count == 8)
        // Run again without the flag: those count as re-published by the earlier run, not as unsigned.
        let rerun = try await harness.heraldctl(["replay", "--name", name, "--json"])
        let rerunSummary = try rerun.json()
        #expect(rerunSummary["alreadyRepublished"]?.numberValue == 8, "\(rerun.stdout)")
        #expect(rerunSummary["skipped"] == .object(["not_replayable": .number(1)]), "\(rerun.stdout)")
    }

    /// On a database of another key layout the removed-token check would read keys that are not there, and skip
    /// every letter as removed: the replay refuses to run, saying what to run first.
    @Test("replay refuses a database of another key layout")
    func replayRefusesAnotherLayout() async throws {
        let harness = try await CtlHarness.make()
        defer { Task { await harness.close() } }
        let url = harness.redisURL
        guard !url.contains(",") else { return } // a cluster has database 0 only
        let other = String(url[..<url.lastIndex(of: "/")!]) + "/8"
        let admin = RedisClient(configuration: try RedisConfiguration(url: other))
        try await admin.command(["SET", RedisLayout.key, "1"])
        try await harness.publish([harness.deadLetter(token: SecureRandom.hex(32))])
        let refused = try await harness.heraldctl(["replay", "--json"], environment: ["HERALD_REDIS_URL": other])
        #expect(refused.status == 1 && refused.stderr.contains("heraldctl redis migrate"), "\(refused.status) \(refused.stderr)")
        #expect(try await harness.jobs(count: 0).isEmpty, "nothing sent")
        try await admin.command(["DEL", RedisLayout.key])
        await admin.close()
    }

    @Test("filters choose what is replayed; --dry-run lists it and publishes nothing; exit 0 when all went")
    func dryRunAndFilters() async throws {
        let harness = try await CtlHarness.make()
        defer { Task { await harness.close() } }
        let tokens = (0..<5).map { _ in SecureRandom.hex(32) }
        for token in tokens { try await harness.subscribe(token) }
        try await harness.publish([
            harness.deadLetter(token: tokens[0], reason: "ServiceUnavailable"),
            harness.deadLetter(token: tokens[1], reason: "ServiceUnavailable"),
            harness.deadLetter(token: tokens[2], reason: "BadTopic", status: 400),
            harness.deadLetter(token: tokens[3], reason: "ServiceUnavailable", pushType: "background"),
            harness.deadLetter(token: tokens[4], reason: "ServiceUnavailable", channel: "orders"),
        ])
        let filters = ["--reason", "ServiceUnavailable", "--push-type", "alert", "--app", harness.app]

        let dry = try await harness.heraldctl(["replay", "--dry-run"] + filters)
        #expect(dry.status == 0, "\(dry.stderr)")
        #expect(dry.stdout.components(separatedBy: "would send replay-").count - 1 == 3)
        #expect(dry.stdout.contains("dry run: nothing sent"))
        #expect(!tokens.contains { dry.stdout.contains($0) })
        let dryJSON = try await harness.heraldctl(["replay", "--dry-run", "--json"] + filters).json()
        #expect(dryJSON["jobs"]?.arrayValue?.count == 3)
        #expect(dryJSON["wouldRepublish"]?.numberValue == 3)
        #expect(dryJSON["dryRun"] == .bool(true))
        #expect(try await harness.jobs(count: 0, extra: .seconds(1)).isEmpty, "a dry run publishes nothing")

        let real = try await harness.heraldctl(["replay", "--json"] + filters)
        #expect(real.status == 0, "\(real.stdout)\n\(real.stderr)")
        #expect(try real.json()["republished"]?.numberValue == 3)
        let jobs = try await harness.jobs(count: 3)
        #expect(Set(jobs.compactMap(\.job.target.deviceToken)) == [tokens[0], tokens[1], tokens[4]])

        let channel = try await harness.heraldctl(["replay", "--json", "--channel", "orders"])
        #expect(channel.status == 0)
        #expect(try channel.json()["republished"]?.numberValue == 1, "another replay (other filters) sends its own")
    }

    @Test("--limit stops early with exit 4; the rerun sends the rest")
    func limit() async throws {
        let harness = try await CtlHarness.make()
        defer { Task { await harness.close() } }
        let tokens = (0..<5).map { _ in SecureRandom.hex(32) }
        for token in tokens { try await harness.subscribe(token) }
        try await harness.publish(tokens.map { harness.deadLetter(token: $0) })
        let limited = try await harness.heraldctl(["replay", "--limit", "2", "--json"])
        #expect(limited.status == 4)
        let summary = try limited.json()
        #expect(summary["stopped"]?.stringValue == "limit")
        // What was read and matched is accounted for: sent, or left (the rest of the batch the limit stopped in).
        let matched = summary["matched"]?.numberValue, left = summary["leftForNextRun"]?.numberValue ?? 0
        #expect(summary["republished"]?.numberValue == 2 && left >= 1 && matched == 2 + left, "\(summary)")
        #expect(try await harness.jobs(count: 2).count == 2)
        let rest = try await harness.heraldctl(["replay", "--json"])
        #expect(rest.status == 0)
        #expect(try rest.json()["republished"]?.numberValue == 3)
        let jobs = try await harness.jobs(count: 5)
        #expect(Set(jobs.map(\.job.id)).count == 5 && jobs.count == 5)
    }

    @Test("a replay stopped half-way (SIGTERM) and run again sends the rest without duplicates")
    func interruptedAndResumed() async throws {
        let harness = try await CtlHarness.make()
        defer { Task { await harness.close() } }
        let tokens = (0..<40).map { _ in SecureRandom.hex(32) }
        for token in tokens { try await harness.subscribe(token) }
        try await harness.publish(tokens.map { harness.deadLetter(token: $0) })

        let running = try harness.start(["replay", "--rate", "20", "--name", "resume-" + SecureRandom.hex(4), "--json"])
        let partial = try await harness.jobs(count: 8, extra: .zero)
        running.signal(SIGTERM)
        let stopped = await running.wait()
        #expect(stopped.status == 4, "\(stopped.stdout)\n\(stopped.stderr)")
        let summary = try stopped.json()
        #expect(summary["stopped"]?.stringValue == "interrupted")
        let sent = try #require(summary["republished"]?.numberValue.map(Int.init))
        #expect(sent >= partial.count && sent < 40)
        #expect(try await harness.jobs(count: sent).count == sent, "every acknowledged job is counted")

        let name = try #require(summary["replay"]?.stringValue)
        let rerun = try await harness.heraldctl(["replay", "--name", name, "--json"])
        #expect(rerun.status == 0)
        #expect(try rerun.json()["republished"]?.numberValue.map(Int.init) == 40 - sent)
        #expect(try rerun.json()["alreadyRepublished"]?.numberValue.map(Int.init) == sent)
        let jobs = try await harness.jobs(count: 40)
        #expect(jobs.count == 40)
        #expect(Set(jobs.compactMap(\.job.target.deviceToken)) == Set(tokens), "each dead letter exactly once")
    }

    @Test("a replay killed outright (SIGKILL) resends at most the job in flight when run again")
    func killedAndResumed() async throws {
        let harness = try await CtlHarness.make()
        defer { Task { await harness.close() } }
        let tokens = (0..<30).map { _ in SecureRandom.hex(32) }
        for token in tokens { try await harness.subscribe(token) }
        try await harness.publish(tokens.map { harness.deadLetter(token: $0) })
        let name = "killed-" + SecureRandom.hex(4)
        let running = try harness.start(["replay", "--rate", "20", "--name", name])
        _ = try await harness.jobs(count: 8, extra: .zero)
        running.signal(SIGKILL)
        _ = await running.wait()

        let rerun = try await harness.heraldctl(["replay", "--name", name, "--json"])
        #expect(rerun.status == 0)
        let jobs = try await harness.jobs(count: 30)
        #expect(Set(jobs.compactMap(\.job.target.deviceToken)) == Set(tokens))
        #expect(jobs.count <= 31, "at most the one job in flight at the kill is sent twice, got \(jobs.count)")
    }

    @Test("a replay whose records Redis refuses stops sending and exits 1")
    func ledgerRefused() async throws {
        let harness = try await CtlHarness.make()
        defer { Task { await harness.close() } }
        let tokens = (0..<60).map { _ in SecureRandom.hex(32) }
        for token in tokens { try await harness.subscribe(token) }
        try await harness.publish(tokens.map { harness.deadLetter(token: $0) })
        // A user that may do all a replay does but add to a set: its reads work, its records are refused.
        let user = "replay-" + SecureRandom.hex(4), password = SecureRandom.hex(16)
        try await harness.redis.command(["ACL", "SETUSER", user, "on", ">" + password, "~*", "&*", "+@all", "-sadd"])
        let url = harness.redisURL.replacingOccurrences(of: "redis://", with: "redis://\(user):\(password)@")
        let refused = try await harness.heraldctl(["replay", "--rate", "20", "--json"], environment: ["HERALD_REDIS_URL": url])
        try await harness.redis.command(["ACL", "DELUSER", user])
        #expect(refused.status == 1, "\(refused.stdout)\n\(refused.stderr)")
        let summary = try refused.json()
        #expect(summary["stopped"]?.stringValue == "error")
        #expect(summary["error"]?.stringValue?.contains("could not be recorded") == true, "\(summary)")
        let sent = try #require(summary["republished"]?.numberValue)
        // At 20 a second the first acknowledgement, hence the first refusal, comes within about ten sends.
        #expect(sent < 40, "sending stops once a record is refused, not after all 60 (\(sent) sent)")
    }

    @Test("a replay whose jobs Kafka stops acknowledging (the broker stopped) stops sending and exits 1")
    func kafkaStopsAcknowledging() async throws {
        let broker = try await TansuBroker.started(directory: try scratchDirectory("herald-ctl-broker-"))
        let harness = try await CtlHarness.make(brokers: broker.address)
        defer { Task { await harness.close() } }
        let tokens = (0..<300).map { _ in SecureRandom.hex(32) }
        for token in tokens { try await harness.subscribe(token) }
        try await harness.publish(tokens.map { harness.deadLetter(token: $0) })
        // 5 a second: the 300 would take a minute. The letters are fetched at once; the jobs' acknowledgements
        // stop when the broker does, and each one sent since fails after --ack-timeout.
        let replay = try harness.start(["replay", "--rate", "5", "--ack-timeout", "5", "--json"])
        try await Task.sleep(for: .seconds(2))
        broker.pause()
        let result = await replay.wait(timeout: .seconds(60))
        broker.resume()
        await broker.crash()
        #expect(result.status == 1, "\(result.stdout)\n\(result.stderr)")
        let summary = try result.json()
        #expect(summary["stopped"]?.stringValue == "error")
        #expect(summary["error"]?.stringValue?.contains("Kafka stopped acknowledging") == true, "\(summary)")
        let sent = (summary["republished"]?.numberValue ?? 0) + (summary["failed"]?.numberValue ?? 0)
        #expect(sent < 250, "sending stops once Kafka stops acknowledging, not after all 300 (\(summary))")
    }

    @Test("exit codes and messages: bad filter 2, Redis or Kafka unreachable 1, --help with examples")
    func errors() async throws {
        let harness = try await CtlHarness.make()
        defer { Task { await harness.close() } }
        let help = try await harness.heraldctl(["replay", "--help"])
        #expect(help.status == 0)
        #expect(help.stdout.contains("Examples:") && help.stdout.contains("--dry-run") && help.stdout.contains("Exit codes"))
        let general = try await harness.heraldctl(["--help"])
        #expect(general.stdout.contains("heraldctl replay"))

        let badRate = try await harness.heraldctl(["replay", "--rate", "fast"])
        #expect(badRate.status == 2 && badRate.stderr.contains("--rate"))
        let badAckTimeout = try await harness.heraldctl(["replay", "--ack-timeout", "0"])
        #expect(badAckTimeout.status == 2 && badAckTimeout.stderr.contains("--ack-timeout: expected a whole number"))
        let badName = try await harness.heraldctl(["replay", "--name", "a b"])
        #expect(badName.status == 2 && badName.stderr.contains("--name"))
        let badSince = try await harness.heraldctl(["replay", "--since", "soon"])
        #expect(badSince.status == 2 && badSince.stderr.contains("--since"))
        // An empty list (a script's unset variable) would otherwise match every app's letters.
        for flag in ["--app", "--reason", "--status", "--push-type"] {
            let empty = try await harness.heraldctl(["replay", flag, " , "])
            #expect(empty.status == 2 && empty.stderr.contains(flag), "\(flag): \(empty.stderr)")
        }

        let noRedis = try await harness.heraldctl(["replay"], environment: ["HERALD_REDIS_URL": "redis://127.0.0.1:1/0"])
        #expect(noRedis.status == 1)
        #expect(noRedis.stderr.contains("cannot reach Redis") && noRedis.stderr.contains("HERALD_REDIS_URL"))
        let noKafka = try await harness.heraldctl(["replay"], environment: ["HERALD_KAFKA_BROKERS": "127.0.0.1:1"])
        #expect(noKafka.status == 1)
        #expect(noKafka.stderr.contains("cannot reach Kafka") && noKafka.stderr.contains("HERALD_KAFKA_BROKERS"))
        let noJobsTopic = try await harness.heraldctl(["replay"], environment: ["HERALD_TOPIC_JOBS": "herald.jobs.missing-" + SecureRandom.hex(4)])
        #expect(noJobsTopic.status == 1 && noJobsTopic.stderr.contains("does not exist"))

        // Progress: plain lines when stderr is not a terminal.
        let token = SecureRandom.hex(32)
        try await harness.subscribe(token)
        try await harness.publish((0..<4).map { _ in harness.deadLetter(token: token) })
        let slow = try await harness.heraldctl(["replay", "--rate", "1"])
        #expect(slow.status == 0, "\(slow.stderr)")
        #expect(slow.stderr.contains("replay auto-") && slow.stderr.contains("re-published") && slow.stderr.contains("ETA"))
        #expect(!slow.stderr.contains("\u{1B}["), "no terminal escapes when stderr is a file")
        // All 4 are read at once, but a letter is done only once its job is acknowledged: not 100 % at 1 a second.
        let firstLine = slow.stderr.split(separator: "\n").first { $0.contains("replay auto-") } ?? ""
        #expect(!firstLine.contains("100%") && firstLine.contains("awaiting the broker"), "\(firstLine)")
        #expect(summaryValue(slow.stdout, "re-published") == 4)

        // A record this version cannot read is not "every matching letter sent": exit 3, counted.
        _ = try await harness.producer.send(topic: harness.dlqTopic, key: Array("x".utf8), value: Array("{\"version\": 99}".utf8))
        let unreadable = try await harness.heraldctl(["replay", "--json"])
        #expect(unreadable.status == 3, "\(unreadable.stdout)\n\(unreadable.stderr)")
        #expect(try unreadable.json()["unreadable"]?.numberValue == 1)
        let otherApp = try await harness.heraldctl(["replay", "--app", "other", "--json"])
        let otherSummary = try otherApp.json()
        #expect(otherApp.status == 0 && otherSummary["unreadable"]?.numberValue == 0, "keyed for app x")
    }
}
