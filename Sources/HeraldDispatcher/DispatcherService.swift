import HeraldAPNs
import HeraldCore
import HeraldHTTP
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldStore

/// herald-dispatcher: consumes push jobs, resolves channels and posts in Redis, delivers through APNs,
/// dead-letters what fails, and serves `/healthz`, `/readyz` and `/metrics`.
///
/// Its parts run as one `ServiceGroup`: the operations server, the heap trimmer, the offset committer and the
/// job consumer. `run()` returns after a graceful stop once its task is cancelled (SIGTERM through the process's
/// group): the consumer stops fetching, lets in-flight jobs finish for up to `drainTimeout`, hands back the rest,
/// commits and leaves the group; then the committer, the trimmer and last the operations server stop. The caller
/// owns (and afterwards shuts down) the Redis client, the dead-letter producer and the APNs client.
public final class DispatcherService: Service {
    private let parts: ServiceGroup
    private let server: HTTPServer
    /// What runs each job record (tests run a record again with it).
    let runner: JobRunner

    /// Binds the operations port (so a taken port fails here) and creates the consumer; nothing is fetched
    /// before `run()`.
    public init(configuration: DispatcherConfiguration, apps: AppRegistry, redis: RedisClient, producer: KafkaProducer,
                apns: APNsClient, logger: Logger, metrics: MetricsRegistry = .shared) throws {
        let counters = DispatcherMetrics(metrics)
        let subscriptions = SubscriptionStore(redis: redis)
        let activities = ActivityStore(redis: redis, ttl: configuration.activityTTL)
        let limit = ConcurrencyLimit(limit: configuration.maxInFlightPushes)
        let deadLetters = DeadLetterWriter(producer: producer, topic: configuration.deadLetterTopic,
                                           signing: configuration.jobSigning,
                                           retryDelay: configuration.infrastructureRetryDelay, metrics: counters,
                                           logger: logger)
        let deliverer = Deliverer(apns: apns, subscriptions: subscriptions, activities: activities,
                                  deadLetters: deadLetters, removals: TokenRemovalGuard(metrics: metrics, logger: logger),
                                  limit: limit, maxAttempts: max(1, configuration.maxAttempts),
                                  backoff: RetryBackoff(initial: configuration.retryInitialDelay,
                                                        maximum: configuration.retryMaximumDelay),
                                  infrastructureRetryDelay: configuration.infrastructureRetryDelay, metrics: counters,
                                  logger: logger)
        let broadcaster = Broadcaster(apns: apns, channels: BroadcastChannelStore(redis: redis), deadLetters: deadLetters,
                                      maxAttempts: max(1, configuration.maxAttempts),
                                      backoff: RetryBackoff(initial: configuration.retryInitialDelay,
                                                            maximum: configuration.retryMaximumDelay),
                                      infrastructureRetryDelay: configuration.infrastructureRetryDelay, logger: logger)
        runner = JobRunner(apps: apps, subscriptions: subscriptions, activities: activities, deliverer: deliverer,
                               broadcaster: broadcaster, deadLetters: deadLetters,
                               progress: FanOutProgress(statuses: JobStatusStore(redis: redis, ttl: configuration.jobStatusTTL),
                                                        group: configuration.consumerGroup, ttl: configuration.progressTTL),
                               limit: limit, batchSize: max(1, configuration.batchSize),
                               maxJobBytes: configuration.maxJobBytes, signing: configuration.jobSigning,
                               maxBatchesInFlight: max(1, configuration.batchesInFlightPerJob),
                               batchPermits: ConcurrencyLimit(limit: configuration.batchesHeld),
                               retryDelay: configuration.infrastructureRetryDelay, metrics: counters, logger: logger)
        let consumer = try JobConsumer(configuration: configuration, runner: runner, metrics: counters, logger: logger)
        var router = Router()
        let jobsTopic = configuration.jobsTopic
        let layout = RedisLayoutCheck(redis: redis, logger: logger)
        let readiness = ReadinessMonitor(checks: [
            "redis": { (try? await redis.command(["PING"])) != nil },
            "redis_layout": { layout.hasPassed },
            "kafka": { (try? await producer.partitionCount(topic: jobsTopic)) ?? 0 > 0 },
            "consumer_group": { consumer.joinedGroup },
        ], failures: ["consumer_group": "joining", "redis_layout": "checking"], metrics: metrics)
        router.addOperations(readiness: readiness)
        router.addMetrics(registry: metrics)
        server = try HTTPServer(configuration: HTTPServerConfiguration(address: configuration.address, threads: 1,
                                                                       shutdownGracePeriod: .seconds(1),
                                                                       accessLog: configuration.accessLog),
                                router: router, logger: logger, metrics: metrics)
        let sweeper = SubscriptionSweeper(apps: apps, subscriptions: subscriptions,
                                          interval: configuration.subscriptionSweepInterval, metrics: metrics, logger: logger)
        let janitor = BroadcastJanitor(apps: apps, broadcaster: broadcaster, interval: configuration.broadcastJanitorInterval,
                                       idle: configuration.broadcastIdle, metrics: metrics, logger: logger)
        // Stopped newest first: the consumer drains while the operations server still answers. What reads or
        // writes Herald's keys by itself waits for the layout check.
        parts = ServiceGroup(services: [layout, server, readiness, HeapTrimmer(),
                                        layout.gating(sweeper), layout.gating(janitor),
                                        layout.gating(OffsetCommitter(consumer: consumer, interval: configuration.commitInterval)),
                                        layout.gating(consumer)],
                             signals: [], gracePeriod: configuration.drainTimeout + .seconds(5), logger: logger)
    }

    /// Where `/healthz`, `/readyz` and `/metrics` listen.
    public var address: HostPort { server.localAddress }

    public func run() async throws {
        try await parts.run()
    }
}
