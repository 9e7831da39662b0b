import Foundation
import HeraldCore
import HeraldCrypto
import HeraldIngest
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldTestSupport

/// herald-ingest running in-process on a free port against the real Redis and broker of `scripts/test`, with a
/// fresh apps file (fresh app ids, so Redis keys never collide) and a fresh jobs topic.
final class IngestHarness: Sendable {
    let apps: TestApps
    let redis: RedisClient
    let producer: KafkaProducer
    let topic: String
    let brokers: String
    let port: UInt16
    /// The port of `/metrics` when `adminPort: true` gave it an address of its own.
    let adminPort: UInt16?
    private let task: Task<Void, any Error>

    /// Starts a service on a free port. `apps`: the apps file to serve (default: two fresh ES256-issuer apps; the
    /// harness removes it on `stop()`); `brokers` set skips creating the jobs topic; `redisURL` replaces the test
    /// Redis (a closed port, a listener that never answers).
    static func start(rateLimit: Int = 240, appRateLimit: Int = 600_000, activityTTL: Duration = .seconds(3600),
                      publishTimeout: Duration = .seconds(5), broadcastChannelWait: Duration = .seconds(10), brokers: String? = nil,
                      redisURL: String? = nil, apps: TestApps? = nil, adminPort: Bool = false) async throws -> IngestHarness {
        let apps = try apps ?? TestApps()
        let brokerList = try brokers ?? TestEnvironment.kafkaBrokers()
        let topic = "herald.jobs.test-" + SecureRandom.hex(6)
        if brokers == nil {
            let admin = try KafkaAdmin(configuration: KafkaConfiguration(brokerList: brokerList), logger: Self.logger)
            try await admin.createTopic(topic, partitions: 2)
            admin.close()
        }
        var configuration = IngestConfiguration()
        configuration.address = HostPort(host: "127.0.0.1", port: 0)
        configuration.rateLimitPerMinute = rateLimit
        configuration.appRateLimitPerMinute = appRateLimit
        configuration.activityTTL = activityTTL
        configuration.jobsTopic = topic
        configuration.publishTimeout = publishTimeout
        configuration.broadcastChannelWait = broadcastChannelWait
        configuration.jobSigning = apps.jobSigning
        if adminPort { configuration.adminAddress = HostPort(host: "127.0.0.1", port: 0) }
        let redis = RedisClient(configuration: try RedisConfiguration(url: try redisURL ?? TestEnvironment.redisURL()))
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(
            kafka: KafkaConfiguration(brokerList: brokerList), messageTimeout: publishTimeout), logger: Self.logger)
        let service = try IngestService(configuration: configuration, apps: AppRegistry(apps.ingestDirectory, reader: .ingest), redis: redis,
                                        producer: producer, logger: Self.logger)
        return IngestHarness(apps: apps, redis: redis, producer: producer, topic: topic, brokers: brokerList,
                             port: service.address.port, adminPort: service.adminAddress?.port,
                             task: Task { try await service.run() })
    }

    private init(apps: TestApps, redis: RedisClient, producer: KafkaProducer, topic: String, brokers: String,
                 port: UInt16, adminPort: UInt16?, task: Task<Void, any Error>) {
        (self.apps, self.redis, self.producer, self.topic, self.brokers, self.port, self.adminPort, self.task) =
            (apps, redis, producer, topic, brokers, port, adminPort, task)
    }

    static let logger = Logger(label: "test", minimumLevel: .warning)

    /// One request on a fresh connection. `key` goes in X-API-Key; a JSON body gets its Content-Type.
    func request(_ method: String, _ path: String, key: String? = nil, bearer: String? = nil, json body: String? = nil,
                 headers: [String: String] = [:]) async throws -> RawHTTPClient.Response {
        var all = headers
        if let key { all["X-API-Key"] = key }
        if let bearer { all["Authorization"] = "Bearer \(bearer)" }
        if body != nil, all["Content-Type"] == nil { all["Content-Type"] = "application/json" }
        let port = self.port, finalHeaders = all
        return try await onThread { try RawHTTPClient(port: port).request(method, path, headers: finalHeaders, body: body) }
    }

    func stop() async {
        task.cancel()
        _ = try? await task.value
        await producer.close()
        await redis.close()
        apps.remove()
    }
}

extension RawHTTPClient.Response {
    /// `error.code` of an error body.
    var errorCode: String? { (try? json())?["error"].flatMap { ($0 as? [String: Any])?["code"] as? String } }
    /// `error.field` of an error body.
    var errorField: String? { (try? json())?["error"].flatMap { ($0 as? [String: Any])?["field"] as? String } }
}

/// A fresh hex device token.
func deviceToken() -> String { SecureRandom.hex(32) }
