import HeraldCore
import HeraldHTTP
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldStore

/// herald-ingest: the HTTP API in front of Redis (subscriptions, registrations, rate limits) and Kafka (jobs).
public final class IngestService: Service {
    let server: HTTPServer

    /// Binds the listening socket (so a taken port fails here, and port 0 is resolved before `run()`).
    public init(configuration: IngestConfiguration, apps: AppRegistry, redis: RedisClient, producer: KafkaProducer,
                logger: Logger) throws {
        let gate = Gatekeeper(apps: apps, limiter: RateLimiter(redis: redis, limit: configuration.rateLimitPerMinute),
                              clockSkew: configuration.clockSkew, logger: logger)
        var router = Router()
        SubscriptionsAPI(store: SubscriptionStore(redis: redis), gate: gate, logger: logger).register(on: &router)
        ActivitiesAPI(store: ActivityStore(redis: redis, ttl: configuration.activityTTL), gate: gate, logger: logger)
            .register(on: &router)
        EventsAPI(producer: producer, idempotency: IdempotencyStore(redis: redis), topic: configuration.jobsTopic,
                  publishTimeout: configuration.publishTimeout, gate: gate, logger: logger)
            .register(on: &router)
        Operations(redis: redis, producer: producer, topic: configuration.jobsTopic).register(on: &router)
        server = try HTTPServer(configuration: configuration.http, router: router, logger: logger)
    }

    /// Where the API listens.
    public var address: HostPort { server.localAddress }

    public func run() async throws {
        try await server.run()
    }
}

/// `/healthz` (alive), `/readyz` (Redis and Kafka reachable), `/metrics`.
struct Operations: Sendable {
    let redis: RedisClient
    let producer: KafkaProducer
    let topic: String

    func register(on router: inout Router) {
        let redis = self.redis, producer = self.producer, topic = self.topic
        router.addOperations(readiness: [
            "redis": { (try? await redis.command(["PING"])) != nil },
            // Bounded well inside the request deadline, so an unreachable broker still gets this body.
            "kafka": { (try? await producer.partitionCount(topic: topic, timeout: .seconds(2))) ?? 0 > 0 },
        ])
        router.addMetrics()
    }
}
