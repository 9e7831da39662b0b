import Foundation
import HeraldAPNs
import HeraldAPNsSimulator
import HeraldCore
import HeraldCrypto
import HeraldDispatcher
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldStore
import HeraldTestSupport
import Testing

let testLogger = Logger(label: "dispatcher-test", minimumLevel: .warning)

/// Two APNs simulators (production and sandbox) that trust the test apps' provider keys, each recording what it
/// accepted, broadcasts included (each serves channel management on a port of its own).
final class SimulatorPair: Sendable {
    let directory: String
    let tls: SimulatorCertificates.Files
    let production: APNsSimulator
    let sandbox: APNsSimulator
    let productionRecord: String
    let sandboxRecord: String

    init(apps: TestApps) throws {
        directory = NSTemporaryDirectory() + "herald-disp-" + SecureRandom.hex(6)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        tls = try SimulatorCertificates.generate(directory: directory + "/tls")
        productionRecord = directory + "/production.jsonl"
        sandboxRecord = directory + "/sandbox.jsonl"
        let keys = apps.apps.map { ProviderKey(teamID: $0.teamID, keyID: $0.keyID, publicKey: $0.apnsKey.publicKey) }
        // Each app's bundle id belongs to its team: a push signed with another app's key is refused.
        let owners = Dictionary(apps.apps.map { ($0.bundleID, Set([$0.teamID])) }, uniquingKeysWith: { $0.union($1) })
        production = try Self.make(record: productionRecord, tls: tls, keys: keys, owners: owners)
        sandbox = try Self.make(record: sandboxRecord, tls: tls, keys: keys, owners: owners)
    }

    private static func make(record: String, tls: SimulatorCertificates.Files, keys: [ProviderKey],
                             owners: [String: Set<String>]) throws -> APNsSimulator {
        var configuration = APNsSimulatorConfiguration(
            listen: HostPort(host: "127.0.0.1", port: 0), certificateChainPath: tls.serverCertificate,
            privateKeyPath: tls.serverKey, providerKeys: keys, recordPath: record)
        configuration.topicOwners = owners
        configuration.manageListen = HostPort(host: "127.0.0.1", port: 0)
        configuration.broadcastRecordPath = record + ".broadcasts"
        let simulator = try APNsSimulator(configuration: configuration, logger: testLogger, metrics: MetricsRegistry())
        try simulator.start()
        return simulator
    }

    func stop() async {
        production.stop()
        sandbox.stop()
        await production.waitUntilStopped()
        await sandbox.waitUntilStopped()
        try? FileManager.default.removeItem(atPath: directory)
    }

    var productionURL: String { "https://127.0.0.1:\(production.port)" }
    var sandboxURL: String { "https://127.0.0.1:\(sandbox.port)" }
    var productionManageURL: String { "https://127.0.0.1:\(production.managePort)" }
    var sandboxManageURL: String { "https://127.0.0.1:\(sandbox.managePort)" }

    /// Pushes the production (or sandbox) simulator accepted so far.
    func accepted(sandbox: Bool = false) -> [JSONValue] {
        readJSONLines(sandbox ? sandboxRecord : productionRecord)
    }

    /// Broadcasts the production (or sandbox) simulator accepted so far.
    func broadcasts(sandbox: Bool = false) -> [JSONValue] {
        readJSONLines((sandbox ? sandboxRecord : productionRecord) + ".broadcasts")
    }
}

/// Fresh topics (jobs with 2 partitions, dead letters with 1) and a fresh consumer group name.
struct TestTopics: Sendable {
    let jobs: String
    let deadLetters: String
    let group: String
    let brokers: String

    /// On `brokers`, or on the broker of `scripts/test` when nil.
    static func make(partitions: Int = 2, brokers: String? = nil) async throws -> TestTopics {
        let brokers = try brokers ?? TestEnvironment.kafkaBrokers()
        let suffix = SecureRandom.hex(5)
        let topics = TestTopics(jobs: "herald.jobs.disp-\(suffix)", deadLetters: "herald.dlq.disp-\(suffix)",
                                group: "herald-dispatcher-\(suffix)", brokers: brokers)
        let admin = try KafkaAdmin(configuration: KafkaConfiguration(brokerList: brokers), logger: testLogger)
        defer { admin.close() }
        try await admin.createTopic(topics.jobs, partitions: partitions)
        try await admin.createTopic(topics.deadLetters, partitions: 1)
        return topics
    }
}

/// herald-dispatcher in-process against the real Redis and broker of `scripts/test`, two in-process APNs
/// simulators, a fresh apps file, fresh topics and a fresh consumer group.
final class DispatcherHarness: Sendable {
    let apps: TestApps
    let simulators: SimulatorPair
    let topics: TestTopics
    let redis: RedisClient
    let producer: KafkaProducer
    let apns: APNsClient
    let metrics: MetricsRegistry
    let port: UInt16
    let service: DispatcherService
    private let task: Task<Void, any Error>

    static func start(maxAttempts: Int = 5, brokers: String? = nil,
                      configure: (inout DispatcherConfiguration) -> Void = { _ in }) async throws -> DispatcherHarness {
        let apps = try TestApps()
        let simulators = try SimulatorPair(apps: apps)
        let topics = try await TestTopics.make(brokers: brokers)
        let redis = RedisClient(configuration: try RedisConfiguration(url: try TestEnvironment.redisURL()))
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(
            kafka: KafkaConfiguration(brokerList: topics.brokers)), logger: testLogger)
        var apnsConfiguration = APNsConfiguration()
        apnsConfiguration.productionURL = simulators.productionURL
        apnsConfiguration.sandboxURL = simulators.sandboxURL
        apnsConfiguration.manageProductionURL = simulators.productionManageURL
        apnsConfiguration.manageSandboxURL = simulators.sandboxManageURL
        apnsConfiguration.extraCAFile = simulators.tls.caCertificate
        apnsConfiguration.connectionStagger = .milliseconds(10)
        let metrics = MetricsRegistry()
        let apns = try APNsClient(configuration: apnsConfiguration, logger: testLogger, metrics: metrics)
        var configuration = DispatcherConfiguration.forTests(topics: topics)
        configuration.maxAttempts = maxAttempts
        configuration.jobSigning = apps.jobSigning
        configure(&configuration)
        let service = try DispatcherService(configuration: configuration, apps: AppRegistry(apps.directory),
                                            redis: redis, producer: producer, apns: apns, logger: testLogger,
                                            metrics: metrics)
        let task = Task {
            // Logged here, or a consumer that gave up would show only as a test's timeout.
            do { try await service.run() } catch {
                testLogger.error("the dispatcher stopped with an error", ["error": "\(error)"])
                throw error
            }
        }
        let harness = DispatcherHarness(apps: apps, simulators: simulators, topics: topics, redis: redis,
                                        producer: producer, apns: apns, metrics: metrics, port: service.address.port,
                                        service: service, task: task)
        try await harness.waitForAssignment()
        return harness
    }

    private init(apps: TestApps, simulators: SimulatorPair, topics: TestTopics, redis: RedisClient,
                 producer: KafkaProducer, apns: APNsClient, metrics: MetricsRegistry, port: UInt16,
                 service: DispatcherService, task: Task<Void, any Error>) {
        (self.apps, self.simulators, self.topics, self.redis, self.producer, self.apns, self.metrics, self.port,
         self.service, self.task) = (apps, simulators, topics, redis, producer, apns, metrics, port, service, task)
    }

    /// Waits until the group assigned partitions to the dispatcher (Tansu takes session.timeout/2 to form it).
    func waitForAssignment() async throws {
        try await eventually("the dispatcher was assigned partitions", timeout: .seconds(30)) {
            metric("herald_dispatcher_partitions_assigned") ?? 0 > 0
        }
    }

    func stop() async {
        task.cancel()
        _ = try? await task.value
        await apns.shutdown(gracePeriod: .milliseconds(200))
        await producer.close()
        await redis.close()
        await simulators.stop()
        apps.remove()
    }

    var subscriptions: SubscriptionStore { SubscriptionStore(redis: redis) }
    var activities: ActivityStore { ActivityStore(redis: redis) }

    @discardableResult
    func subscribe(_ app: TestApps.Entry, channel: String, token: String, type: TokenType = .alert,
                   environment: APNsEnvironment = .production, activityID: String? = nil) async throws -> Subscription {
        var body: [String: JSONValue] = ["channel": .string(channel), "deviceToken": .string(token),
                                         "tokenType": .string(type.rawValue), "environment": .string(environment.rawValue)]
        if let activityID { body["activityID"] = .string(activityID) }
        return try await subscriptions.upsert(app: app.id, SubscriptionInput(.object(body))).subscription
    }

    func register(_ app: TestApps.Entry, post: String, token: String, bundleID: String? = nil,
                  environment: APNsEnvironment = .production) async throws {
        let input = try ActivityRegistrationInput(.object([
            "push_token": .string(token), "post_id_hash": .string(post), "bundle_id": .string(bundleID ?? app.bundleID),
            "apns_environment": .string(environment.rawValue),
        ]), app: apps.directory.apps[app.id]!)
        _ = try await activities.register(app: app.id, user: "default", input)
    }

    /// Produces `job` signed with the deployment's secret, as ingest writes it (to `partition`, or where its key
    /// hashes).
    func produce(_ job: PushJob, partition: Int32? = nil) async throws {
        try await produce(raw: job.encoded(), key: job.recordKey, partition: partition)
    }

    /// Produces a record with `headers`, by default the deployment's signature of `raw`.
    func produce(raw: [UInt8], key: String, headers: [(String, [UInt8])]? = nil, partition: Int32? = nil) async throws {
        _ = try await producer.send(topic: topics.jobs, key: key, value: raw, headers: headers ?? apps.signatureHeaders(raw),
                                    partition: partition)
    }

    func produce(raw: String, key: String) async throws {
        try await produce(raw: Array(raw.utf8), key: key)
    }

    /// The value of an unlabelled metric (or the sum over a family's children matching `labels`).
    func metric(_ name: String, labels: [String: String] = [:]) -> Double? {
        metricValue(metrics.render(), name, labels: labels)
    }

    /// Every dead letter written so far.
    func deadLetters(expecting count: Int, timeout: Duration = .seconds(20)) async throws -> [JSONValue] {
        try await readTopic(topics.deadLetters, brokers: topics.brokers, expecting: count, timeout: timeout)
            .map { try JSONDecoder().decode(JSONValue.self, from: Data($0.value)) }
    }
}

extension DispatcherConfiguration {
    /// Short times for tests; Tansu-friendly group settings (see platform notes).
    static func forTests(topics: TestTopics) -> DispatcherConfiguration {
        var configuration = DispatcherConfiguration()
        configuration.address = HostPort(host: "127.0.0.1", port: 0)
        configuration.jobsTopic = topics.jobs
        configuration.deadLetterTopic = topics.deadLetters
        configuration.consumerGroup = topics.group
        configuration.kafka = KafkaConfiguration(brokerList: topics.brokers, clientID: "herald-dispatcher-test")
        // Tansu forms a new group in half the session timeout: 1.5 s per test, where a dead member matters
        // to no test of this target.
        configuration.sessionTimeout = .seconds(3)
        configuration.maxPollInterval = .seconds(10)
        configuration.fetchStallRecovery = FetchStallRecovery(stallTimeout: .seconds(30))
        configuration.retryInitialDelay = .milliseconds(50)
        configuration.retryMaximumDelay = .milliseconds(400)
        configuration.infrastructureRetryDelay = .milliseconds(100)
        configuration.drainTimeout = .seconds(5)
        return configuration
    }
}

/// Reads `topic` from the beginning, outside any group, until `count` records arrived (or `timeout` passed; a
/// short wait follows so that extra records show up too).
func readTopic(_ topic: String, brokers: String, expecting count: Int, timeout: Duration) async throws -> [KafkaRecord] {
    let consumer = try KafkaConsumer(configuration: KafkaConsumerConfiguration(
        kafka: KafkaConfiguration(brokerList: brokers), groupID: nil), logger: testLogger)
    let partitions = try await consumer.partitionCount(topic: topic)
    try await consumer.assign((0..<partitions).map {
        KafkaTopicPartitionOffset(topic: topic, partition: Int32($0), offset: KafkaTopicPartitionOffset.beginning)
    })
    var records: [KafkaRecord] = []
    let clock = ContinuousClock()
    let end = clock.now + timeout
    while records.count < count, clock.now < end {
        records += try await consumer.poll(maxRecords: 1000, timeout: .milliseconds(200))
    }
    // Anything beyond the expected count (a duplicate dead letter, say) would show up now.
    let settle = clock.now + .milliseconds(500)
    while clock.now < settle { records += try await consumer.poll(maxRecords: 1000, timeout: .milliseconds(100)) }
    try await consumer.close()
    return records
}

/// A fresh hex device token, optionally starting with `prefix` (for simulator rules).
func deviceToken(_ prefix: String = "") -> String {
    prefix + SecureRandom.hex(32).dropFirst(prefix.count)
}

/// A fresh post id hash.
func postHash() -> String { SecureRandom.hex(8) }

extension JSONValue {
    /// `self[a][b]…` for a path of object keys.
    subscript(path path: String...) -> JSONValue? {
        var value: JSONValue? = self
        for key in path { value = value?[key] }
        return value
    }
}
