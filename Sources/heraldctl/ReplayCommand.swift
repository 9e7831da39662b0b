// Over 400 lines: a replay's options, selection, sending and resumable bookkeeping are one flow, read top to bottom.
import Dispatch
import Foundation
import HeraldCore
import HeraldCrypto
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldStore
import Synchronization

/// `heraldctl replay`: re-publishes matching dead letters to the jobs topic as device (or broadcast) jobs, each at
/// most once per replay name.
enum ReplayCommand {
    static let usage = """
        heraldctl replay — send failed deliveries again: re-publish matching dead letters (HERALD_TOPIC_DLQ) to
        HERALD_TOPIC_JOBS as device jobs (a failed broadcast as a broadcast job, published once to its channel),
        each marked "replayOf" with the original job id and dead-letter offset.

        Usage:
          heraldctl replay [FILTERS] [--name NAME] [--dry-run] [--limit N] [--rate JOBS_PER_S] [--include-removed]
                           [--include-replayed] [--include-unsigned] [--json]

        Filters: the same as `heraldctl dlq list` (see heraldctl dlq --help): --app, --since, --until, --status,
        --reason, --push-type, --channel, --post. Check what they select with `dlq list` or --dry-run first.

        Options:
          --name NAME         the replay's name (letters, digits, . _ -; at most 64). Default: derived from the
                              filters as written, so the same command line is the same replay. Printed at the end.
          --dry-run           send nothing; list the jobs that would be sent (nothing is recorded either)
          --limit N           re-publish at most N jobs in this run; run again to continue
          --rate R            at most R jobs per second (default: as fast as Kafka acknowledges)
          --ack-timeout S     how long a job may wait for Kafka's acknowledgement, in seconds (default 30); one
                              left unanswered that long stops the replay
          --include-removed   also send to tokens that no longer have any subscription or Live Activity
                              registration in Redis, and to broadcast channels their post no longer has
                              (skipped by default: the device was unregistered, or the post ended, since)
          --include-replayed  also send dead letters of jobs that were themselves replays (skipped by default, so
                              a replay that fails again does not feed the next run; counted apart in the summary)
          --include-unsigned  also send dead letters without a signature by the deployment's secret (skipped by
                              default: anyone able to write to the topic could have put them there); for letters
                              written before dispatchers signed them, or under another secret: check them first
          --json              print the summary as one JSON object (with --dry-run, preceded by the jobs)

        Safe to run twice: each re-published dead letter is recorded in Redis (set herald:replay:{NAME}:sent of
        "partition:offset", kept 30 days) right after Kafka acknowledged its job, and a run skips what its name
        already sent. Ctrl-C or SIGTERM stops after the jobs in flight are acknowledged and recorded, so a rerun
        sends exactly the rest. A replay killed outright (SIGKILL, power loss) can send again the jobs handed to
        Kafka but not yet recorded at that moment: at most 5,000 (sending waits while that many are unanswered or
        not yet recorded). A run whose records Redis refuses stops sending (exit 1), and so does one whose job Kafka
        left unanswered for --ack-timeout, or refused 20 in a row (such a job may have reached Kafka all the same:
        a rerun sends it again, so its devices may get it twice). The job id of a replayed job is
        replay-NAME-PARTITION-OFFSET. Do not run the same replay from two places at once. After the topic is
        deleted and created again, its letters reuse old positions: give replays of it a new --name.

        The topic is read from --since (offsets-for-times) or the beginning up to where it ended when the replay
        started; records are handled in batches, never the whole topic in memory. Progress goes to stderr: a bar
        with counts and ETA on a terminal, a plain line every 2 s otherwise.

        Exit codes:
          0  every matching dead letter is re-published (now or by an earlier run of this replay)
          1  failed: Kafka or Redis unreachable, or some jobs were not acknowledged (run again to retry them)
          2  bad usage or filter
          3  done, but some matching dead letters were skipped (token removed, not replayable, unsigned, invalid job) or some
             records could not be read; the summary says why
          4  stopped before the end (--limit reached, or interrupted); run the same command again to continue

        Examples:
          heraldctl replay --app shop --since 2h --reason ServiceUnavailable --dry-run
          heraldctl replay --app shop --since 2h --reason ServiceUnavailable --rate 500
          heraldctl replay --name incident-42 --since 2024-05-01T08:00:00Z --until 2024-05-01T09:30:00Z --json
          heraldctl replay --channel order-1234 --include-removed --limit 100

        Environment: HERALD_KAFKA_BROKERS [127.0.0.1:9092], HERALD_REDIS_URL [redis://127.0.0.1:6379/0],
        HERALD_TOPIC_JOBS [herald.jobs], HERALD_TOPIC_DLQ [herald.dlq], HERALD_JOB_SIGNING_SECRET_FILE (the
        deployment's secret replayed jobs are signed with; required unless HERALD_JOB_SIGNATURES=unverified).
        """

    enum Exit: Int32 {
        case done = 0, failed = 1, skipped = 3, incomplete = 4
    }

    /// Why a run stopped before reading everything.
    enum Stop: String {
        case limit, interrupted, error
    }

    /// At most this many jobs are sent and not yet recorded at once (flat memory, bounded resend on a crash).
    static let maxUnrecorded = 5_000

    static func run(_ flags: Flags) async throws -> Int32 {
        let filter = try DLQFilter(flags)
        let name = try replayName(flags, filter: filter)
        let limit = try flags.int("limit", default: 0, range: 0...Int.max)
        let rate = try flags["rate"].map { raw -> Double in
            guard let value = Double(raw), value >= 0.01, value.isFinite else {
                throw ConfigurationError("--rate", "expected jobs per second, at least 0.01, got \"\(raw)\"")
            }
            return value
        }
        let ackTimeout = try flags.int("ack-timeout", default: 30, range: 1...3_600)
        let options = Options(name: name, limit: limit, rate: rate, ackTimeout: .seconds(ackTimeout),
                              dryRun: flags.has("dry-run"),
                              includeRemoved: flags.has("include-removed"), includeReplayed: flags.has("include-replayed"),
                              includeUnsigned: flags.has("include-unsigned"), json: flags.has("json"))
        let connections = try Connections()
        // Replayed jobs are signed as ingest signs events: the dispatcher refuses unsigned ones. The secret also
        // tells the dispatchers' dead letters from anyone else's: a dry run without either variable checks none.
        let environment = EnvironmentReader()
        let signing = options.dryRun && environment.optionalString("HERALD_JOB_SIGNING_SECRET_FILE") == nil
            && environment.optionalString("HERALD_JOB_SIGNATURES") == nil ? .unverified : try JobSigning(environment)
        let redis = try connections.redis()
        do {
            let code = try await run(options, filter: filter, connections: connections, signing: signing, redis: redis)
            await redis.close()
            return code
        } catch {
            await redis.close()
            throw error
        }
    }

    private static func run(_ options: Options, filter: DLQFilter, connections: Connections, signing: JobSigning,
                            redis: RedisClient) async throws -> Int32 {
        let layout: Int?
        do {
            _ = try await redis.command(["PING"])
            layout = try await RedisLayout.version(of: redis)
        } catch {
            throw connections.explain(error)
        }
        // The removed-token check reads this version's keys: on another layout every token would look removed.
        if let layout, layout != RedisLayout.current {
            throw OperatorError("Redis holds Herald's key layout \(layout); this heraldctl reads layout \(RedisLayout.current): "
                                + "run `heraldctl redis migrate` first")
        }
        var producer: KafkaProducer?
        if !options.dryRun {
            let created = try KafkaProducer(configuration: KafkaProducerConfiguration(
                kafka: connections.kafka, messageTimeout: options.ackTimeout, linger: .milliseconds(5)), logger: connections.logger)
            do {
                _ = try await created.partitionCount(topic: connections.jobsTopic)
            } catch {
                await created.close()
                throw connections.explain(error, topic: connections.jobsTopic)
            }
            producer = created
        }
        let reader: DLQReader
        do {
            reader = try await DLQReader.open(connections, filter: filter)
        } catch {
            await producer?.close()
            throw error
        }
        let replay = Replay(options: options, filter: filter, connections: connections, signing: signing,
                            redis: redis, producer: producer, reader: reader)
        let summary = await replay.run()
        await reader.close()
        await producer?.close()
        return summary.print(options: options, connections: connections, output: replay.output)
    }

    /// `--name`, or a name derived from the DLQ topic and the filters exactly as written.
    static func replayName(_ flags: Flags, filter: DLQFilter) throws -> String {
        if let name = flags["name"] {
            let allowed = name.utf8.allSatisfy {
                (0x30...0x39).contains($0) || (0x41...0x5a).contains($0) || (0x61...0x7a).contains($0) || [0x2e, 0x5f, 0x2d].contains($0)
            }
            guard (1...64).contains(name.utf8.count), allowed else {
                throw ConfigurationError("--name", "1–64 letters, digits, '.', '_' or '-'")
            }
            return name
        }
        let topic = try Connections().dlqTopic
        return "auto-" + Hex.encode(SHA256.hash("\(topic)\n\(filter.canonical)").prefix(6))
    }

    /// A replayed job's id: the same dead letter replayed by the same replay always gets the same id.
    static func jobID(name: String, entry: DLQEntry) -> String { "replay-\(name)-\(entry.partition)-\(entry.offset)" }

    struct Options {
        var name: String
        var limit: Int
        var rate: Double?
        /// Kafka's `message.timeout.ms` for the replayed jobs: a job unanswered this long stops the replay.
        var ackTimeout: Duration
        var dryRun: Bool
        var includeRemoved: Bool
        var includeReplayed: Bool
        var includeUnsigned: Bool
        var json: Bool
    }
}

/// One replay run: reads, selects, checks Redis, sends, records.
final class Replay {
    let options: ReplayCommand.Options
    let filter: DLQFilter
    let connections: Connections
    let signing: JobSigning
    let redis: RedisClient
    let producer: KafkaProducer?
    let reader: DLQReader
    let ledger: ReplayLedger
    let counters = ReplayCounters()
    let output = Output()
    private var stopRequested: StopRequest?
    private var summary = ReplaySummary()
    private var nextSendAt = ContinuousClock.now
    private var listed = 0

    init(options: ReplayCommand.Options, filter: DLQFilter, connections: Connections, signing: JobSigning,
         redis: RedisClient, producer: KafkaProducer?, reader: DLQReader) {
        (self.options, self.filter, self.connections, self.signing, self.redis, self.producer, self.reader) =
            (options, filter, connections, signing, redis, producer, reader)
        ledger = ReplayLedger(name: options.name, redis: redis)
        summary.name = options.name
    }

    func run() async -> ReplaySummary {
        let started = ContinuousClock.now
        let ledger = self.ledger
        let recorder = Task { () -> (any Error)? in
            do {
                try await ledger.run()
                return nil
            } catch {
                return error
            }
        }
        stopRequested = StopRequest()
        let progress = ProgressDisplay()
        let counters = self.counters
        let published: PublishedCounts
        if options.dryRun {
            published = { (acknowledged: counters.sent.load(ordering: .relaxed), inFlight: 0) }
        } else {
            published = { ledger.progress }
        }
        progress.start(name: options.name, reader: reader, counters: counters, published: published)
        if options.dryRun, options.json { output.write("{\"jobs\":[") }
        do {
            try await reader.read { entries in try await self.handle(entries) }
        } catch {
            summary.stop = .error
            summary.error = connections.explain(error, topic: connections.dlqTopic).description
        }
        // Should a job given up here still reach Kafka, a rerun sends it again.
        await ledger.waitForAnswers(grace: .seconds(10))
        if summary.error == nil, let stalled = ledger.stoppedAcknowledging { recordUnacknowledged(stalled) }
        ledger.finish()
        if let error = await recorder.value {
            summary.stop = .error
            summary.error = "re-published jobs could not be recorded in Redis (\(connections.explain(error))); "
                + "a rerun of this replay may send them again"
        }
        await progress.stop()
        if options.dryRun, options.json { output.write(listed == 0 ? "]," : "\n],") }
        let outcome = ledger.outcome
        summary.republished = options.dryRun ? counters.sent.load(ordering: .relaxed) : outcome.acknowledged
        summary.failures = outcome.failures
        summary.scanned = reader.scanned.current
        summary.elapsed = ContinuousClock.now - started
        return summary
    }

    /// Handles one batch; false stops the scan.
    private func handle(_ entries: [DLQEntry]) async throws -> Bool {
        if stops(atLimit: false) { return false }
        // Tuples of the entry (a class) and not of its dead letter: a letter is a large struct to copy.
        // `refused`: why it is not sent unless an earlier run of this replay sent it (with `--include-unsigned`).
        var candidates: [(entry: DLQEntry, member: String, refused: String?)] = []
        for entry in entries {
            guard let letter = entry.letter else {
                // Counted when it could be one the filters select: not one keyed for another app.
                if filter.apps.isEmpty || entry.keyApp.map(filter.apps.contains) != false { summary.unreadable += 1 }
                continue
            }
            guard filter.matches(letter, at: entry.time) else { continue }
            if letter.job?.replayOf != nil, !options.includeReplayed {
                summary.replayedSkipped += 1
                continue
            }
            summary.matched += 1
            summary.byReason[letter.reason, default: 0] += 1
            counters.matched.add(1, ordering: .relaxed)
            // Only what this deployment's dispatchers wrote is signed again: anyone else able to write to the
            // topic could otherwise push as any app through a routine replay.
            var refused: String?
            if case .signed(let secret) = signing, !options.includeUnsigned,
               !JobSignature.verifies(entry.headers, record: entry.record, secrets: [secret]) {
                refused = "unsigned"
            } else if letter.deviceToken == nil && letter.channelId == nil || letter.payload == nil {
                refused = "not_replayable"
            }
            candidates.append((entry, ReplayLedger.member(partition: entry.partition, offset: entry.offset), refused))
        }
        guard !candidates.isEmpty else { return true }
        let already = try await ledger.alreadySent(candidates.map(\.member))
        let live = options.includeRemoved ? nil
            : try await stillRegistered(candidates.filter { $0.refused == nil && !already.contains($0.member) }.map(\.entry))
        var toSend: [(entry: DLQEntry, member: String)] = []
        defer { counters.waiting.store(0, ordering: .relaxed) }
        for candidate in candidates {
            if already.contains(candidate.member) {
                summary.alreadyRepublished += 1
                counters.already.add(1, ordering: .relaxed)
            } else if let refused = candidate.refused {
                skip(refused)
            } else if let live, let letter = candidate.entry.letter, let target = ReplayTarget(letter), !live.contains(target) {
                skip(letter.channelId == nil ? "token_removed" : "channel_removed")
            } else {
                toSend.append((candidate.entry, candidate.member))
            }
        }
        let now = Date(), name = options.name
        let jobs = parallelMap(toSend) { candidate -> Result<(key: String, bytes: [UInt8])?, ValidationError> in
            let entry = candidate.entry
            return Result { () throws(ValidationError) in
                try entry.letter?.replayRecord(record: entry.record, partition: entry.partition, offset: entry.offset,
                                        id: ReplayCommand.jobID(name: name, entry: entry), now: now)
            }
        }
        counters.waiting.store(toSend.count, ordering: .relaxed)
        for (position, ((entry, member), built)) in zip(toSend, jobs).enumerated() {
            if stops(atLimit: true) {
                // The rest of the batch, matched but not sent, is left for the next run.
                summary.leftForNextRun += toSend.count - position
                return false
            }
            counters.waiting.subtract(1, ordering: .relaxed)
            guard case .success(let job?) = built else {
                if case .failure = built { skip("invalid_job") } else { skip("not_replayable") }
                continue
            }
            await pace()
            if let producer {
                send(job.bytes, key: job.key, member: member, producer: producer)
                await ledger.waitForUnrecorded(below: ReplayCommand.maxUnrecorded)
            } else {
                list(id: ReplayCommand.jobID(name: name, entry: entry), entry: entry)
            }
            counters.sent.add(1, ordering: .relaxed)
        }
        return true
    }

    /// Whether the scan stops before what comes next, with the reason recorded: interrupted; the ledger no longer
    /// able to record what is sent (its error is reported once the scan stops; sending more would only add to what a
    /// rerun sends again); Kafka no longer acknowledging (the rest would time out too); with `atLimit`, `--limit`.
    private func stops(atLimit: Bool) -> Bool {
        if atLimit, options.limit > 0, counters.sent.load(ordering: .relaxed) >= options.limit {
            summary.stop = .limit
        } else if stopRequested?.isSet == true {
            summary.stop = .interrupted
        } else if ledger.hasFailed {
            summary.stop = .error
        } else if let stalled = ledger.stoppedAcknowledging {
            recordUnacknowledged(stalled)
        } else {
            return false
        }
        return true
    }

    /// Kafka stopped acknowledging the jobs (`ReplayLedger.stoppedAcknowledging`).
    private func recordUnacknowledged(_ stalled: (count: Int, lastError: String)) {
        summary.stop = .error
        summary.error = "Kafka stopped acknowledging jobs (the last \(stalled.count) failed, \(stalled.lastError)), so the replay "
            + "stopped sending; run it again once \(connections.jobsTopic) takes writes: it sends what was not acknowledged"
    }

    private func skip(_ reason: String) {
        summary.skipped[reason, default: 0] += 1
        counters.skipped.add(1, ordering: .relaxed)
    }

    private func send(_ job: [UInt8], key: String, member: String, producer: KafkaProducer) {
        let ledger = self.ledger
        ledger.sending()
        do {
            try producer.send(topic: connections.jobsTopic, key: Array(key.utf8), value: job,
                              headers: signing.headers(for: job)) { result in
                ledger.delivered(member, result)
            }
        } catch {
            ledger.notSent(error)
        }
    }

    /// A dry run's line for one job (the token shortened: it is a credential).
    private func list(id: String, entry: DLQEntry) {
        guard let letter = entry.letter else { return }
        let original = letter.jobId ?? letter.job?.id ?? "unknown"
        if options.json {
            let line: JSONValue = .object([
                "id": .string(id), "appId": .string(letter.appId), "token": .string(maskedToken(letter.deviceToken)),
                "dlqPartition": .number(Double(entry.partition)), "dlqOffset": .number(Double(entry.offset)),
                "replayOf": .string(original), "reason": .string(letter.reason),
            ])
            output.write((listed == 0 ? "\n" : ",\n") + String(decoding: line.encoded(), as: UTF8.self))
        } else {
            output.write(("would send \(id)  app \(letter.appId)  token \(maskedToken(letter.deviceToken))  "
                          + "replayOf \(original)  (\(letter.reason))").escapingControls + "\n")
        }
        listed += 1
    }

    /// Waits for the next slot under `--rate`.
    private func pace() async {
        guard let rate = options.rate else { return }
        let now = ContinuousClock.now
        if nextSendAt > now { try? await Task.sleep(until: nextSendAt) }
        nextSendAt = max(nextSendAt, now) + .nanoseconds(Int64(1e9 / rate))
    }

    /// Which of these letters' targets are still there: a token with a subscription or a live Live Activity
    /// registration, a broadcast channel its post still has (the final update or the janitor deletes them).
    private func stillRegistered(_ entries: [DLQEntry]) async throws -> Set<ReplayTarget> {
        let targets = Array(Set(entries.compactMap { $0.letter.flatMap(ReplayTarget.init) }))
        let now = String(Int64(Date().timeIntervalSince1970 * 1000))
        var commands: [[String]] = []
        var firstReply: [Int] = []
        for target in targets {
            let redisKeys = RedisKeys(app: target.app)
            firstReply.append(commands.count)
            switch target.kind {
            case .token(let token):
                commands.append(["SCARD", redisKeys.device(token)])
                // The token index is scored by expiry: only registrations that have not expired count.
                commands.append(["ZCOUNT", redisKeys.activityToken(token), "(" + now, "+inf"])
            case .channel(_, let post, let environment):
                commands.append(["HGET", redisKeys.broadcast(post), environment.rawValue])
            }
        }
        guard !commands.isEmpty else { return [] }
        let replies = try await redis.pipeline(commands)
        // An error (an ACL without SCARD, WRONGTYPE) is no answer: read as 0, every token would look removed.
        for case .error(let message) in replies { throw RedisError.fromReply(message) }
        var live: Set<ReplayTarget> = []
        for (target, first) in zip(targets, firstReply) {
            switch target.kind {
            case .token:
                if (replies[first].int ?? 0) + (replies[first + 1].int ?? 0) > 0 { live.insert(target) }
            case .channel(let id, _, _):
                let stored = replies[first].string.flatMap { JSONValue(parsing: Array($0.utf8)) }
                if stored?["channelId"]?.stringValue == id { live.insert(target) }
            }
        }
        return live
    }
}

/// Where a dead letter's replay would go: a device token, or a broadcast channel of a post.
struct ReplayTarget: Hashable {
    enum Kind: Hashable {
        case token(String)
        case channel(id: String, post: String, environment: APNsEnvironment)
    }

    var app: String
    var kind: Kind

    /// Nil for a letter with neither (or a broadcast whose post is unknown, which cannot be checked).
    init?(_ letter: DeadLetter) {
        app = letter.appId
        if let token = letter.deviceToken {
            kind = .token(token)
        } else if let id = letter.channelId, let post = letter.originalPost, let environment = letter.environment {
            kind = .channel(id: id, post: post, environment: environment)
        } else {
            return nil
        }
    }
}

/// SIGINT / SIGTERM ask a replay to stop after what is in flight; a second one exits at once.
// The dispatch sources are created and resumed in init and never touched again; the flag is atomic.
final class StopRequest: @unchecked Sendable {
    private let flag = Atomic(false)
    private var sources: [any DispatchSourceSignal] = []

    init() {
        for number in [SIGINT, SIGTERM] {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { [self] in requested(number) }
            source.resume()
            sources.append(source)
        }
    }

    var isSet: Bool { flag.load(ordering: .relaxed) }

    private func requested(_ number: Int32) {
        if flag.exchange(true, ordering: .relaxed) { exit(128 + number) }
        FileHandle.standardError.write(Data("heraldctl: stopping after the jobs in flight are acknowledged and recorded (again to quit now)\n".utf8))
    }
}

/// What a replay did, for the summary and the exit status.
struct ReplaySummary {
    var name = ""
    var scanned = 0
    var matched = 0
    var unreadable = 0
    var republished = 0
    var alreadyRepublished = 0
    /// Dead letters of replayed jobs, left out without `--include-replayed`.
    var replayedSkipped = 0
    /// Matched and read, not sent: the run stopped first (`--limit`, interrupted, an error).
    var leftForNextRun = 0
    var skipped: [String: Int] = [:]
    var byReason: [String: Int] = [:]
    var failures: [String: Int] = [:]
    var stop: ReplayCommand.Stop?
    var error: String?
    var elapsed: Duration = .zero

    var failed: Int { failures.values.reduce(0, +) }

    var exit: ReplayCommand.Exit {
        if stop == .error || failed > 0 { return .failed }
        if stop != nil { return .incomplete }
        // A record this version cannot read may be a letter the filters would have matched (one written by a newer
        // dispatcher, say): not "all done".
        if !skipped.isEmpty || unreadable > 0 { return .skipped }
        return .done
    }

    static let skipExplanations = [
        "token_removed": "the token has no subscription or registration left (unregistered since); --include-removed sends anyway",
        "channel_removed": "the broadcast channel is gone from its post (ended or idle since); --include-removed sends anyway",
        "not_replayable": "no device, channel or payload to send again (e.g. invalid_job)",
        "unsigned": "no signature by the deployment's secret: written by someone else, or before dispatchers signed their letters; --include-unsigned sends anyway",
        "invalid_job": "the replayed job would not pass validation (e.g. payload too large, or a priority Apple refuses for its push type)",
    ]

    /// Prints the summary (stdout) and the reason for a failure (stderr); returns the exit status.
    func print(options: ReplayCommand.Options, connections: Connections, output: Output) -> Int32 {
        let seconds = elapsed.inSeconds
        if options.json {
            func object(_ counts: [String: Int]) -> JSONValue { .object(counts.mapValues { .number(Double($0)) }) }
            let document: JSONValue = .object([
                "replay": .string(name), "dryRun": .bool(options.dryRun),
                "dlqTopic": .string(connections.dlqTopic), "jobsTopic": .string(connections.jobsTopic),
                "scanned": .number(Double(scanned)), "matched": .number(Double(matched)),
                "unreadable": .number(Double(unreadable)),
                (options.dryRun ? "wouldRepublish" : "republished"): .number(Double(republished)),
                "alreadyRepublished": .number(Double(alreadyRepublished)),
                "leftForNextRun": .number(Double(leftForNextRun)),
                "replayedLeftOut": .number(Double(replayedSkipped)),
                "skipped": object(skipped), "byReason": object(byReason),
                "failed": .number(Double(failed)), "failures": object(failures),
                "stopped": stop.map { .string($0.rawValue) } ?? .null,
                "error": error.map { .string($0) } ?? .null,
                "seconds": .number((seconds * 1000).rounded() / 1000),
                "exitCode": .number(Double(exit.rawValue)),
            ])
            let text = String(decoding: document.encoded(), as: UTF8.self)
            // A dry run's JSON already opened the object with its jobs.
            output.write(options.dryRun ? String(text.dropFirst()) + "\n" : text + "\n")
        } else {
            var lines = ["replay \(name) of \(connections.dlqTopic) → \(connections.jobsTopic)"
                         + (options.dryRun ? " (dry run: nothing sent)" : "")]
            func add(_ label: String, _ value: Int, _ note: String = "") {
                lines.append("  " + label.padding(24) + String(value).leftPadded(8) + (note.isEmpty ? "" : "  " + note))
            }
            add("dead letters read", scanned)
            add("matching", matched)
            if replayedSkipped > 0 {
                add("left out: replays", replayedSkipped, "dead letters of replayed jobs; --include-replayed sends them")
            }
            add(options.dryRun ? "would re-publish" : "re-published", republished)
            add("already re-published", alreadyRepublished, "by an earlier run of this replay")
            for (reason, count) in skipped.sorted(by: { $0.key < $1.key }) {
                add("skipped: \(reason)", count, Self.skipExplanations[reason] ?? "")
            }
            if leftForNextRun > 0 {
                add("left for the next run", leftForNextRun, "matching, not sent before the run stopped")
            }
            if failed > 0 {
                add("not acknowledged", failed, failures.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }
                        .joined(separator: ", ") + "; run the same replay again to retry them")
            }
            if unreadable > 0 { add("unreadable records", unreadable, "not dead letters this version understands") }
            switch stop {
            case .limit: lines.append("stopped at --limit \(options.limit); run the same command again to continue")
            case .interrupted: lines.append("interrupted; run the same command again to continue")
            case .error, nil: break
            }
            lines.append(String(format: "%.1f s", seconds))
            output.write(lines.joined(separator: "\n") + "\n")
        }
        output.flush()
        if let error { FileHandle.standardError.write(Data("heraldctl: \(error)\n".utf8)) }
        return exit.rawValue
    }
}

extension String {
    func leftPadded(_ width: Int) -> String {
        count >= width ? self : String(repeating: " ", count: width - count) + self
    }
}
