import Foundation
import HeraldCrypto
import HeraldKafka
import HeraldRuntime
import HeraldTestSupport
import Testing

// The whole stack as processes, an event stream through ingest's HTTP API, and the bookkeeping every fault test
// ends with: events accepted (202) against pushes the simulator recorded and dead letters on the DLQ topic.

let faultLogger = Logger(label: "fault-test", minimumLevel: .warning)

/// A redis-server of the test's own on a free port, which the test can crash and start again.
///
/// It runs with an append-only file fsynced before every reply (`appendfsync always`) in a folder kept across
/// restarts: subscriptions are Herald's source of truth and a production Redis holding them persists them, so a
/// restart must not be an amnesia that would lose every subscriber (and with them the pushes the test counts).
final class RedisServer: Sendable {
    let port: UInt16
    let directory: String
    private let process = Lock<ChildProcess?>(nil)

    init(directory: String) throws {
        port = try freePort()
        self.directory = directory + "/redis"
        try FileManager.default.createDirectory(atPath: self.directory, withIntermediateDirectories: true)
    }

    var url: String { "redis://127.0.0.1:\(port)/0" }

    /// Starts redis-server (loading the append-only file, if any) and waits until it answers PING.
    func start() async throws {
        let child = try ChildProcess("redis-server", executable: "/usr/bin/redis-server", arguments: [
            "--bind", "127.0.0.1", "--port", "\(port)", "--dir", directory, "--save", "", "--appendonly", "yes",
            "--appendfsync", "always", "--daemonize", "no",
        ], environment: [:], logPath: directory + "/redis.log")
        process.withLock { $0 = child }
        let port = self.port
        try await eventually("redis-server answers on \(port)", timeout: .seconds(10)) {
            (try? runTool("redis-cli", ["-p", "\(port)", "ping"]))?.contains("PONG") == true
        }
    }

    func crash() async {
        guard let child = process.withLock({ p -> ChildProcess? in defer { p = nil }; return p }) else { return }
        await child.crash()
    }
}

/// Fresh topic names and consumer group on some brokers.
struct FaultTopics: Sendable {
    let brokers: String
    let jobs: String
    let deadLetters: String
    let group: String

    init(brokers: String) {
        let suffix = SecureRandom.hex(5)
        self.brokers = brokers
        jobs = "herald.jobs.fault-\(suffix)"
        deadLetters = "herald.dlq.fault-\(suffix)"
        group = "herald-fault-\(suffix)"
    }

    /// Creates both topics (what `heraldctl topics create` does at deployment).
    func create(partitions: Int, security: KafkaSecurity = KafkaSecurity()) async throws {
        var kafka = KafkaConfiguration(brokerList: brokers)
        kafka.security = security
        let admin = try KafkaAdmin(configuration: kafka, logger: faultLogger)
        defer { admin.close() }
        try await admin.createTopic(jobs, partitions: partitions)
        try await admin.createTopic(deadLetters, partitions: 1)
    }
}

/// A service that crashes writes the stacks of its threads into its log (Swift's backtracer).
let crashTraces = ["SWIFT_BACKTRACE": "enable=yes,interactive=no,color=no"]

/// herald-ingest as a process.
final class IngestServer: Sendable {
    let child: ChildProcess
    let port: UInt16

    init(apps: TestApps, redisURL: String, topics: FaultTopics, directory: String, name: String,
         extra: [String: String] = [:]) throws {
        port = try freePort()
        child = try ChildProcess("herald-ingest", executable: try builtExecutable("herald-ingest"), environment: [
            "HERALD_INGEST_ADDR": "127.0.0.1:\(port)",
            "HERALD_APPS_FILE": apps.path, "HERALD_JOB_SIGNING_SECRET_FILE": apps.jobSigningSecretPath,
            "HERALD_REDIS_URL": redisURL,
            "HERALD_KAFKA_BROKERS": topics.brokers,
            "HERALD_TOPIC_JOBS": topics.jobs,
            "HERALD_RATE_LIMIT_PER_MINUTE": "1000000",
            "HERALD_LOG_LEVEL": "info",
        ].merging(crashTraces) { _, new in new }.merging(extra) { _, new in new }, logPath: directory + "/\(name).log")
    }

    func request(_ method: String, _ path: String, key: String? = nil, json body: String? = nil,
                 timeout: Int = 10) async throws -> RawHTTPClient.Response {
        let port = self.port
        var headers = ["Content-Type": "application/json"]
        if let key { headers["X-API-Key"] = key }
        let sent = headers
        return try await onThread {
            try RawHTTPClient(port: port, timeout: timeout).request(method, path, headers: sent, body: body)
        }
    }

    func readyStatus() async -> Int { (try? await request("GET", "/readyz", timeout: 3))?.status ?? 0 }

    func waitUntilReady(timeout: Duration = .seconds(20)) async throws {
        try await eventually("\(child.name) on \(port) is ready", timeout: timeout) { await readyStatus() == 200 }
    }
}

extension DispatcherProcess {
    /// A dispatcher on `topics`, against `redisURL`.
    convenience init(apps: TestApps, simulator: SimulatorProcess, topics: FaultTopics, redisURL: String,
                     directory: String, name: String, extra: [String: String] = [:]) throws {
        try self.init(apps: apps, simulator: simulator, brokers: topics.brokers, jobsTopic: topics.jobs,
                      deadLetterTopic: topics.deadLetters, group: topics.group, directory: directory, name: name,
                      extra: ["HERALD_REDIS_URL": redisURL].merging(crashTraces) { _, new in new }
                          .merging(extra) { _, new in new })
    }

    func readyStatus() async -> Int { (try? await get("/readyz"))?.status ?? 0 }
}

/// The set-up most fault scenarios share: the jobs and dead-letter topics (2 partitions), a simulator, one ingest
/// and one dispatcher as processes, and an audience subscribed through the ingest, the dispatcher assigned.
struct FaultStack {
    let simulator: SimulatorProcess
    let ingest: IngestServer
    let dispatcher: DispatcherProcess
    let audience: Audience

    static func start(apps: TestApps, redisURL: String, topics: FaultTopics, directory: String, channelCount: Int,
                      perChannel: Int, rules: [JSONValue] = [], ingestExtra: [String: String] = [:],
                      dispatcherName: String = "dispatcher", dispatcherExtra: [String: String] = [:],
                      noBroadcast: [String] = [],
                      prefix: (Int, Int) -> String = { _, _ in "" }) async throws -> FaultStack {
        try await topics.create(partitions: 2)
        let simulator = try SimulatorProcess(apps: apps, directory: directory, rules: rules, noBroadcast: noBroadcast)
        let ingest = try IngestServer(apps: apps, redisURL: redisURL, topics: topics, directory: directory, name: "ingest",
                                      extra: ingestExtra)
        try await simulator.waitUntilListening()
        let dispatcher = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, redisURL: redisURL,
                                               directory: directory, name: dispatcherName, extra: dispatcherExtra)
        try await ingest.waitUntilReady()
        let audience = try await Audience.subscribe(app: apps.apps[0], through: ingest, channelCount: channelCount,
                                                    perChannel: perChannel, prefix: prefix)
        try await dispatcher.waitForAssignment()
        return FaultStack(simulator: simulator, ingest: ingest, dispatcher: dispatcher, audience: audience)
    }
}

/// Resident set size of a process in bytes, from /proc.
func residentBytes(_ pid: Int32) -> Int? {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
          let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
          let kilobytes = line.split(separator: " ").dropFirst().first.flatMap({ Int($0) }) else { return nil }
    return kilobytes * 1024
}

// MARK: - Subscribers and the event stream

/// Channels, each with the same number of subscribed tokens, subscribed through ingest's API.
struct Audience: Sendable {
    let channels: [String]
    /// Tokens per channel, same order as `channels`.
    let tokens: [[String]]

    /// `channelCount` channels of `perChannel` tokens; `prefix(channel, slot)` picks a token's first hex digits
    /// (for simulator rules). A token given none starts with `1`, which no rule of these tests names: a random one
    /// began with a rule's prefix (`dead`, `bad0`) about once in 30 runs of a 1,000-token channel.
    static func subscribe(app: TestApps.Entry, through ingest: IngestServer, channelCount: Int, perChannel: Int,
                          prefix: (Int, Int) -> String = { _, _ in "" }) async throws -> Audience {
        let run = SecureRandom.hex(4)
        var channels: [String] = [], tokens: [[String]] = []
        for channel in 0..<channelCount {
            let name = "fault-\(run)-\(channel)"
            var list: [String] = []
            for slot in 0..<perChannel {
                let chosen = prefix(channel, slot), start = chosen.isEmpty ? "1" : chosen
                let token = start + SecureRandom.hex(32).dropFirst(start.count)
                let created = try await ingest.request("POST", "/v1/apps/\(app.id)/subscriptions", key: app.publicKey,
                                                       json: #"{"channel": "\#(name)", "deviceToken": "\#(token)", "tokenType": "alert"}"#)
                try #require(created.status == 201, "subscribe: \(created.status) \(created.text)")
                list.append(token)
            }
            channels.append(name)
            tokens.append(list)
        }
        return Audience(channels: channels, tokens: tokens)
    }

    /// Event `n` goes to channel `n % channels.count`.
    func tokens(ofEvent n: Int) -> [String] { tokens[n % tokens.count] }
}

/// A steady stream of channel events through ingest's HTTP API, each with a client id (`ev-<run>-<n>`) so that a
/// retry publishes at most once, and a payload field `n` the pushes and dead letters carry back.
///
/// Each event is sent to the next ingest of `targets` in turn; when the connection fails (an ingest restarting)
/// it goes to the next one, like a load balancer, with the same id. The answer recorded per event is its HTTP
/// status, or 0 when no ingest answered.
final class EventStream: Sendable {
    struct Outcome: Sendable {
        var status: Int
        var sentAt: ContinuousClock.Instant
        var answeredAt: ContinuousClock.Instant
    }

    private struct State {
        var targets: [IngestServer]
        var next = 0
        var outcomes: [Int: Outcome] = [:]
        var sent = 0
        var stop = false
        var hold = false
    }

    let app: TestApps.Entry
    let audience: Audience
    let run = SecureRandom.hex(4)
    private let interval: Duration
    private let state: Lock<State>
    private let task = Lock<Task<Void, Never>?>(nil)

    init(app: TestApps.Entry, audience: Audience, targets: [IngestServer], perSecond: Int) {
        self.app = app
        self.audience = audience
        interval = .seconds(1) / perSecond
        state = Lock(State(targets: targets))
    }

    func start() {
        task.withLock { $0 = Task.detached { await self.loop() } }
    }

    /// Stops sending and waits for the request in progress.
    func stop() async {
        state.withLock { $0.stop = true }
        await task.withLock { $0 }?.value
    }

    /// Pauses (true) or resumes (false) the stream; pausing returns once the request in progress is answered.
    func hold(_ paused: Bool) async throws {
        state.withLock { $0.hold = paused }
        guard paused else { return }
        // The loop takes its next number under the same lock that reads `hold`: once every number taken has an
        // answer, nothing is in flight and nothing new starts.
        try await eventually("the stream paused", timeout: .seconds(30)) {
            state.withLock { s in s.outcomes.count >= s.sent }
        }
    }

    func setTargets(_ targets: [IngestServer]) { state.withLock { $0.targets = targets } }

    var sent: Int { state.withLock { $0.sent } }
    var outcomes: [Int: Outcome] { state.withLock { $0.outcomes } }
    var accepted: [Int] { outcomes.filter { $0.value.status == 202 }.map(\.key).sorted() }

    private func loop() async {
        let clock = ContinuousClock()
        var due = clock.now
        while true {
            enum Next { case stop, hold, send(Int) }
            let next = state.withLock { s -> Next in
                if s.stop { return .stop }
                if s.hold { return .hold }
                defer { s.sent += 1 }
                return .send(s.sent)
            }
            guard case .send(let n) = next else {
                if case .stop = next { return }
                try? await Task.sleep(for: .milliseconds(10))
                due = clock.now
                continue
            }
            let sentAt = clock.now
            let status = await post(n)
            state.withLock { $0.outcomes[n] = Outcome(status: status, sentAt: sentAt, answeredAt: clock.now) }
            due = max(due + interval, clock.now - interval * 4) // no catch-up burst after a slow answer
            try? await Task.sleep(until: due, clock: .continuous)
        }
    }

    private func post(_ n: Int) async -> Int {
        let body = """
            {"channel": "\(audience.channels[n % audience.channels.count])", "id": "ev-\(run)-\(n)",
             "alert": {"aps": {"alert": {"title": "event \(n)"}}, "n": \(n)}}
            """
        let targets = state.withLock { s -> [IngestServer] in
            defer { s.next += 1 }
            return (0..<s.targets.count).map { s.targets[(s.next + $0) % s.targets.count] }
        }
        for ingest in targets {
            guard let response = try? await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey,
                                                           json: body) else { continue }
            return response.status
        }
        return 0
    }
}

// MARK: - Counting

/// Reads a topic from its beginning outside any group, accumulating what arrives.
final class TopicReader: Sendable {
    private let consumer: KafkaConsumer
    private let records = Lock<[KafkaRecord]>([])

    init(topic: String, brokers: String) async throws {
        consumer = try KafkaConsumer(configuration: KafkaConsumerConfiguration(
            kafka: KafkaConfiguration(brokerList: brokers), groupID: nil), logger: faultLogger)
        let partitions = try await consumer.partitionCount(topic: topic)
        try await consumer.assign((0..<partitions).map {
            KafkaTopicPartitionOffset(topic: topic, partition: Int32($0), offset: KafkaTopicPartitionOffset.beginning)
        })
    }

    /// Everything read so far, after polling for `wait`.
    func read(wait: Duration = .milliseconds(300)) async throws -> [KafkaRecord] {
        let clock = ContinuousClock()
        let end = clock.now + wait
        repeat {
            let batch = try await consumer.poll(maxRecords: 1000, timeout: .milliseconds(100))
            records.withLock { $0 += batch }
        } while clock.now < end
        return records.withLock { $0 }
    }

    func close() async { try? await consumer.close() }
}

/// One push owed: event `n` to `token`.
struct Owed: Hashable, Sendable {
    var n: Int
    var token: String
}

/// The books of one run: what was owed by accepted events against what the simulator and the DLQ show.
struct Tally: CustomStringConvertible {
    var attempted = 0
    var accepted = 0
    var refused = 0 // 503 or no answer
    var owed = 0
    var delivered = 0 // distinct owed pushes at the simulator
    var deadLettered = 0 // distinct owed pushes dead-lettered (and never delivered)
    var duplicates = 0 // deliveries beyond the first of a push
    var missing: [Owed] = []
    var strangers = 0 // deliveries of pushes no attempted event owed
    var refusedButDelivered = 0 // events answered 503 yet delivered (published after the answer: allowed)

    var description: String {
        "attempted \(attempted), accepted \(accepted), refused \(refused); pushes owed \(owed), delivered \(delivered), "
            + "dead-lettered \(deadLettered), duplicates \(duplicates), missing \(missing.count), strangers \(strangers), "
            + "refused-but-delivered events \(refusedButDelivered)"
    }

    static func count(stream: EventStream, simulator: SimulatorProcess, deadLetters: [KafkaRecord]) -> Tally {
        var tally = Tally()
        let outcomes = stream.outcomes
        tally.attempted = outcomes.count
        var owed = Set<Owed>()
        for (n, outcome) in outcomes {
            if outcome.status == 202 {
                tally.accepted += 1
                for token in stream.audience.tokens(ofEvent: n) { owed.insert(Owed(n: n, token: token)) }
            } else {
                tally.refused += 1
            }
        }
        tally.owed = owed.count
        var seen: [Owed: Int] = [:]
        for record in simulator.accepted() {
            guard let n = record["payload"]?["n"]?.numberValue, let token = record["token"]?.stringValue else { continue }
            seen[Owed(n: Int(n), token: token), default: 0] += 1
        }
        var dead = Set<Owed>()
        for record in deadLetters {
            guard let letter = try? JSONDecoder().decode(JSONValue.self, from: Data(record.value)),
                  let n = letter["payload"]?["n"]?.numberValue, let token = letter["deviceToken"]?.stringValue else { continue }
            dead.insert(Owed(n: Int(n), token: token))
        }
        for (push, times) in seen {
            tally.duplicates += times - 1
            if owed.contains(push) { tally.delivered += 1 } else if outcomes[push.n] == nil { tally.strangers += 1 }
        }
        tally.deadLettered = owed.filter { dead.contains($0) && seen[$0] == nil }.count
        tally.missing = owed.filter { seen[$0] == nil && !dead.contains($0) }.sorted { ($0.n, $0.token) < ($1.n, $1.token) }
        let deliveredEvents = Set(seen.keys.map(\.n))
        tally.refusedButDelivered = outcomes.filter { $0.value.status != 202 && deliveredEvents.contains($0.key) }.count
        return tally
    }

    /// Waits until every owed push is delivered or dead-lettered (checking the simulator every 200 ms and the
    /// DLQ every couple of seconds), then a second more for late duplicates; the final tally.
    static func settle(stream: EventStream, simulator: SimulatorProcess, topics: FaultTopics,
                       timeout: Duration) async throws -> Tally {
        let reader = try await TopicReader(topic: topics.deadLetters, brokers: topics.brokers)
        let clock = ContinuousClock()
        let end = clock.now + timeout
        var deadLetters = try await reader.read(wait: .milliseconds(100))
        var lastRead = clock.now
        while clock.now < end {
            if count(stream: stream, simulator: simulator, deadLetters: deadLetters).missing.isEmpty { break }
            try await Task.sleep(for: .milliseconds(200))
            if clock.now - lastRead > .seconds(2) {
                deadLetters = try await reader.read(wait: .milliseconds(100))
                lastRead = clock.now
            }
        }
        try await Task.sleep(for: .seconds(1))
        deadLetters = try await reader.read()
        await reader.close()
        return count(stream: stream, simulator: simulator, deadLetters: deadLetters)
    }
}

/// A fault test's figures, printed in one line for RELIABILITY.md.
func report(_ scenario: String, _ tally: Tally, faults: String, started: ContinuousClock.Instant) {
    let elapsed = ContinuousClock.now - started
    let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    print("FAULT \(scenario): \(tally); faults: \(faults); \(String(format: "%.1f", seconds)) s")
}

/// Removes a test's scratch folder, unless `keep` (a check failed): then its processes' logs stay for the
/// post-mortem.
func cleanUp(_ directory: String, keep: Bool) {
    if keep { print("kept the logs in \(directory)") } else { try? FileManager.default.removeItem(atPath: directory) }
}

/// How a child ended, for failure messages: "running", "exit 1" or "signal 11".
func exitStatus(_ child: ChildProcess) -> String {
    if child.isRunning { return "\(child.name) running" }
    let how = child.process.terminationReason == .uncaughtSignal ? "signal" : "exit"
    return "\(child.name) \(how) \(child.process.terminationStatus)"
}
