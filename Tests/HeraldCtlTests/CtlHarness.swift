import Foundation
import HeraldCore
import HeraldCrypto
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldStore
import HeraldTestSupport
import Testing

/// What a finished heraldctl run printed.
struct CtlResult {
    var status: Int32
    var stdout: String
    var stderr: String

    /// stdout as one JSON document.
    func json() throws -> JSONValue {
        do { return try JSONDecoder().decode(JSONValue.self, from: Data(stdout.utf8)) } catch {
            Issue.record("stdout is not JSON: \(stdout)\nstderr: \(stderr)")
            throw error
        }
    }
}

/// A heraldctl process started in the background (for tests that stop it half-way).
final class CtlProcess {
    let process: Process
    let directory: String
    private let exited: AsyncStream<Void>

    init(executable: String, arguments: [String], environment: [String: String]) throws {
        directory = NSTemporaryDirectory() + "heraldctl-test-" + SecureRandom.hex(6)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.environment = environment
        process.standardInput = FileHandle.nullDevice
        _ = FileManager.default.createFile(atPath: directory + "/out", contents: nil)
        _ = FileManager.default.createFile(atPath: directory + "/err", contents: nil)
        process.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: directory + "/out"))
        process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: directory + "/err"))
        let (stream, continuation) = AsyncStream<Void>.makeStream()
        exited = stream
        process.terminationHandler = { _ in continuation.finish() }
        try process.run()
    }

    func signal(_ number: Int32) { kill(process.processIdentifier, number) }

    /// Waits for the exit (killing the process after `timeout`) and returns what it printed.
    func wait(timeout: Duration = .seconds(60)) async -> CtlResult {
        let pid = process.processIdentifier, arguments = process.arguments ?? []
        let watchdog = Task {
            try await Task.sleep(for: timeout)
            Issue.record("heraldctl \(arguments) did not finish within \(timeout)")
            kill(pid, SIGKILL)
        }
        for await _ in exited {}
        watchdog.cancel()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        return CtlResult(status: process.terminationStatus,
                         stdout: (try? String(contentsOfFile: directory + "/out", encoding: .utf8)) ?? "",
                         stderr: (try? String(contentsOfFile: directory + "/err", encoding: .utf8)) ?? "")
    }
}

/// The number on the line of a replay's text summary that starts with `label`.
func summaryValue(_ stdout: String, _ label: String) -> Int? {
    for line in stdout.split(separator: "\n") {
        let trimmed = line.trimmingCharacters(in: .whitespaces)
        guard trimmed.hasPrefix(label + " ") else { continue }
        return trimmed.dropFirst(label.count).split(separator: " ").first.flatMap { Int($0) }
    }
    return nil
}

/// A fresh dead-letter topic and jobs topic on the test broker, a fresh app id, and heraldctl pointed at them.
struct CtlHarness {
    static let logger = Logger(label: "heraldctl-test", minimumLevel: .warning)

    let app: String
    let dlqTopic: String
    let jobsTopic: String
    let brokers: String
    let redisURL: String
    let producer: KafkaProducer
    let redis: RedisClient
    /// The deployment's job-signing secret replays sign with (`HERALD_JOB_SIGNING_SECRET_FILE`).
    let jobSigningSecretPath: String

    /// `jobSigningSecretPath`: the secret file of the dispatcher that will read the replayed jobs, if any.
    /// `brokers`: a broker of the test's own instead of the shared one.
    static func make(partitions: Int = 2, jobSigningSecretPath: String? = nil, brokers: String? = nil) async throws -> CtlHarness {
        let brokers = try brokers ?? TestEnvironment.kafkaBrokers()
        let redisURL = try TestEnvironment.redisURL()
        let suffix = SecureRandom.hex(5)
        let admin = try KafkaAdmin(configuration: KafkaConfiguration(brokerList: brokers), logger: logger)
        defer { admin.close() }
        let dlqTopic = "herald.dlq.test-" + suffix, jobsTopic = "herald.jobs.test-" + suffix
        try await admin.createTopic(dlqTopic, partitions: partitions)
        try await admin.createTopic(jobsTopic, partitions: 2)
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(
            kafka: KafkaConfiguration(brokerList: brokers), messageTimeout: .seconds(10)), logger: logger)
        let redis = RedisClient(configuration: try RedisConfiguration(url: redisURL))
        let secretPath = jobSigningSecretPath ?? NSTemporaryDirectory() + "herald-ctl-jobs-\(suffix).secret"
        if jobSigningSecretPath == nil {
            try SharedSecret.generateText().write(toFile: secretPath, atomically: true, encoding: .utf8)
        }
        return CtlHarness(app: "app" + suffix, dlqTopic: dlqTopic, jobsTopic: jobsTopic, brokers: brokers,
                          redisURL: redisURL, producer: producer, redis: redis, jobSigningSecretPath: secretPath)
    }

    func close() async {
        await producer.close()
        await redis.close()
    }

    var environment: [String: String] {
        ProcessInfo.processInfo.environment.merging([
            "HERALD_KAFKA_BROKERS": brokers, "HERALD_REDIS_URL": redisURL,
            "HERALD_TOPIC_DLQ": dlqTopic, "HERALD_TOPIC_JOBS": jobsTopic,
            "HERALD_JOB_SIGNING_SECRET_FILE": jobSigningSecretPath,
        ]) { _, new in new }
    }

    /// Runs heraldctl to completion.
    func heraldctl(_ arguments: [String], environment extra: [String: String] = [:],
                   timeout: Duration = .seconds(60)) async throws -> CtlResult {
        try await start(arguments, environment: extra).wait(timeout: timeout)
    }

    func start(_ arguments: [String], environment extra: [String: String] = [:]) throws -> CtlProcess {
        try CtlProcess(executable: try builtExecutable("heraldctl"), arguments: arguments,
                       environment: environment.merging(extra) { _, new in new })
    }

    /// A dead letter of a device push (or of a channel / post job's push to one device) that failed.
    func deadLetter(app: String? = nil, token: String? = SecureRandom.hex(32), reason: String = "ServiceUnavailable",
                    status: Int? = 503, pushType: String = "alert", channel: String? = nil, post: String? = nil,
                    deadLetteredAt: Date = Date()) -> DeadLetter {
        let app = app ?? self.app
        let target: PushJob.Target
        if let channel {
            target = .channel(channel)
        } else if let post {
            target = .post(post)
        } else {
            target = .device(token ?? "00", tokenType: .alert, environment: .sandbox)
        }
        var job = PushJob(id: "job-" + SecureRandom.hex(6), appId: app, target: target)
        // Quotes, braces, escapes and non-ASCII text: replay copies this payload's JSON text into the new job.
        let payload: JSONValue = .object([
            "aps": .object(["alert": .object(["title": .string("Your order \"1234\" shipped {soon} ✓ 😀"),
                                              "body": .string("a\\b / [c]")]), "badge": .number(2)]),
            "order": .string("1234"), "items": .array([.number(1), .bool(true), .null, .object(["sku": .string("}")])]),
        ])
        switch target.kind {
        case .channel: job.alert = payload
        case .post: job.liveActivity = PushJob.LiveActivity(event: .update, contentState: .object(["stage": .string("out")]))
        case .device, .broadcast: job.payload = payload
        }
        guard let token else {
            // A job that was invalid as a whole: only its text is kept.
            var letter = DeadLetter(appId: app, job: nil, reason: reason, attempts: 1, deadLetteredAt: deadLetteredAt)
            letter.rawJob = #"{"id": 1}"#
            return letter
        }
        var letter = DeadLetter(appId: app, job: job, reason: reason, attempts: 5, deadLetteredAt: deadLetteredAt)
        letter.deviceToken = token
        letter.tokenType = .alert
        letter.environment = .sandbox
        letter.topic = "com.example." + app
        letter.pushType = pushType
        letter.payload = payload
        letter.priority = pushType == "background" ? 5 : 10
        letter.status = status
        letter.firstAttemptAt = Timestamp.rfc3339(deadLetteredAt.addingTimeInterval(-2))
        letter.lastAttemptAt = Timestamp.rfc3339(deadLetteredAt)
        letter.source = DeadLetter.Source(topic: "herald.jobs", partition: 0, offset: 7)
        return letter
    }

    /// Writes dead letters as the dispatcher does (key `<app>/device/<token>`, signed with the deployment's secret,
    /// or with `secret`, or unsigned when `signed` is false); returns where each went.
    @discardableResult
    func publish(_ letters: [DeadLetter], signed: Bool = true, secret: SharedSecret? = nil) async throws -> [KafkaDeliveryReport] {
        let deployment = try SharedSecret(path: jobSigningSecretPath)
        var reports: [KafkaDeliveryReport] = []
        for letter in letters {
            let value = letter.encoded()
            let headers = signed ? JobSignature.headers(for: value, secret: secret ?? deployment) : []
            reports.append(try await producer.send(topic: dlqTopic, key: letter.recordKey, value: value, headers: headers))
        }
        return reports
    }

    /// Gives the token a channel subscription, so replay sends to it.
    func subscribe(_ token: String, app: String? = nil) async throws {
        let input = try SubscriptionInput(.object(["channel": .string("news"), "deviceToken": .string(token),
                                                   "tokenType": .string("alert")]))
        _ = try await SubscriptionStore(redis: redis).upsert(app: app ?? self.app, input)
    }

    /// Reads the jobs topic until `count` jobs arrived, then `extra` longer to catch any that should not have.
    func jobs(count: Int, extra: Duration = .milliseconds(1500), deadline: Duration = .seconds(30)) async throws
        -> [(job: PushJob, bytes: [UInt8], key: String)] {
        let consumer = try KafkaConsumer(configuration: KafkaConsumerConfiguration(
            kafka: KafkaConfiguration(brokerList: brokers), groupID: nil), logger: Self.logger)
        let partitions = try await consumer.partitionCount(topic: jobsTopic)
        try await consumer.assign((0..<partitions).map {
            KafkaTopicPartitionOffset(topic: jobsTopic, partition: Int32($0), offset: KafkaTopicPartitionOffset.beginning)
        })
        var records: [KafkaRecord] = []
        let clock = ContinuousClock()
        let end = clock.now + deadline
        while records.count < count, clock.now < end {
            records += try await consumer.poll(maxRecords: 1000, timeout: .milliseconds(200))
        }
        let quietEnd = clock.now + extra
        while clock.now < quietEnd {
            records += try await consumer.poll(maxRecords: 1000, timeout: .milliseconds(200))
        }
        try await consumer.close()
        return try records.map { record in
            (try PushJob.decode(record.value), record.value, String(decoding: record.key ?? [], as: UTF8.self))
        }
    }
}
