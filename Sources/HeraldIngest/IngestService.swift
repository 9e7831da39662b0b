import HeraldCore
import HeraldHTTP
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldStore

/// herald-ingest: the HTTP API in front of Redis (subscriptions, registrations, rate limits) and Kafka (jobs).
public final class IngestService: Service {
    let server: HTTPServer
    private let parts: ServiceGroup

    /// Binds the listening socket (so a taken port fails here, and port 0 is resolved before `run()`).
    public init(configuration: IngestConfiguration, apps: AppRegistry, redis: RedisClient, producer: KafkaProducer,
                logger: Logger) throws {
        let limiter = RateLimiter(redis: redis, limit: configuration.rateLimitPerMinute,
                                  appLimit: configuration.appRateLimitPerMinute)
        let gate = Gatekeeper(apps: apps, limiter: limiter,
                              clockSkew: configuration.clockSkew, logger: logger)
        var router = Router()
        let subscriptions = SubscriptionStore(redis: redis, ttl: configuration.subscriptionTTL,
                                              maxPerDevice: configuration.maxSubscriptionsPerDevice)
        SubscriptionsAPI(store: subscriptions, gate: gate, logger: logger).register(on: &router)
        ActivitiesAPI(store: ActivityStore(redis: redis, ttl: configuration.activityTTL), gate: gate, logger: logger)
            .register(on: &router)
        EventsAPI(producer: producer, idempotency: IdempotencyStore(redis: redis), topic: configuration.jobsTopic,
                  signing: configuration.jobSigning, publishTimeout: configuration.publishTimeout, gate: gate, logger: logger)
            .register(on: &router)
        let readiness = Operations.readiness(redis: redis, producer: producer, topic: configuration.jobsTopic)
        router.addOperations(readiness: readiness)
        router.addMetrics()
        server = try HTTPServer(configuration: configuration.http, router: router, logger: logger)
        // Stopped newest first: readiness stops being worked out, then the server drains.
        parts = ServiceGroup(services: [server, readiness], signals: [],
                             gracePeriod: configuration.http.shutdownGracePeriod + .seconds(5), logger: logger)
    }

    /// Where the API listens.
    public var address: HostPort { server.localAddress }

    public func run() async throws {
        try await parts.run()
    }
}

/// What `/readyz` reports: Redis and Kafka reachable.
enum Operations {
    static func readiness(redis: RedisClient, producer: KafkaProducer, topic: String) -> ReadinessMonitor {
        ReadinessMonitor(checks: [
            "redis": { (try? await redis.command(["PING"])) != nil },
            // Bounded well inside the check interval's reach, so an unreachable broker is reported in time.
            "kafka": { (try? await producer.partitionCount(topic: topic, timeout: .seconds(2))) ?? 0 > 0 },
        ])
    }
}
