import HeraldCore
import HeraldHTTP
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldStore

/// herald-ingest: the HTTP API in front of Redis (subscriptions, registrations, rate limits) and Kafka (jobs).
public final class IngestService: Service {
    let server: HTTPServer
    /// `/healthz`, `/readyz` and `/metrics` on their own address, when `configuration.adminAddress` is set.
    let adminServer: HTTPServer?
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
        // A claim outlives the longest wait for the broker, so a client's retry cannot publish beside it.
        let idempotency = IdempotencyStore(redis: redis,
                                           claimTimeout: max(.seconds(30), configuration.publishTimeout + .seconds(10)))
        let events = EventsAPI(producer: producer, idempotency: idempotency,
                               statuses: JobStatusStore(redis: redis, ttl: configuration.jobStatusTTL),
                               topic: configuration.jobsTopic, signing: configuration.jobSigning,
                               publishTimeout: configuration.publishTimeout, gate: gate, logger: logger)
        events.register(on: &router)
        BroadcastAPI(channels: BroadcastChannelStore(redis: redis), events: events, gate: gate,
                     wait: configuration.broadcastChannelWait)
            .register(on: &router)
        let readiness = Operations.readiness(redis: redis, producer: producer, topic: configuration.jobsTopic)
        router.addOperations(readiness: readiness)
        if let adminAddress = configuration.adminAddress {
            // Metrics off the public port: the API's address serves the probes, never the metrics.
            var admin = Router()
            admin.addOperations(readiness: readiness)
            admin.addMetrics()
            adminServer = try HTTPServer(configuration: HTTPServerConfiguration(address: adminAddress, threads: 1,
                                                                                shutdownGracePeriod: .seconds(1)),
                                         router: admin, logger: logger)
        } else {
            router.addMetrics()
            adminServer = nil
        }
        server = try HTTPServer(configuration: configuration.http, router: router, logger: logger)
        // Stopped newest first: readiness stops being worked out, then the servers drain.
        parts = ServiceGroup(services: [RedisLayoutCheck(redis: redis, logger: logger), server]
                                        + (adminServer.map { [$0] } ?? []) + [readiness], signals: [],
                             gracePeriod: configuration.http.shutdownGracePeriod + .seconds(5), logger: logger)
    }

    /// Where the API listens.
    public var address: HostPort { server.localAddress }

    /// Where `/metrics` listens when it has an address of its own.
    public var adminAddress: HostPort? { adminServer?.localAddress }

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
