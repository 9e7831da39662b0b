import Foundation
import HeraldAPNs
import HeraldCore
import HeraldDispatcher
import HeraldKafka
import HeraldRedis
import HeraldRuntime

let defaults = DispatcherConfiguration()
let usage = """
    herald-dispatcher — consumes herald.jobs, resolves channels and posts in Redis, sends to APNs, dead-letters
    failures. Serves /healthz, /readyz and /metrics.

    Usage: herald-dispatcher [--help]

    Environment (defaults in brackets):
      HERALD_DISPATCHER_ADDR          health and metrics address [\(defaults.address)]
      HERALD_APPS_FILE                apps file [config/apps.json]; SIGHUP reloads it
      HERALD_JOB_SIGNING_SECRET_FILE  the deployment's job-signing secret; required unless
                                      HERALD_JOB_SIGNATURES=unverified (jobs are then not checked)
    \(RedisConfiguration.usage)
      HERALD_KAFKA_BROKERS            [127.0.0.1:9092]
    \(KafkaSecurity.usage)
      HERALD_TOPIC_JOBS               [\(defaults.jobsTopic)]
      HERALD_TOPIC_DLQ                [\(defaults.deadLetterTopic)]
      HERALD_CONSUMER_GROUP           [\(defaults.consumerGroup)]
      HERALD_CONSUMER_INSTANCE_ID     static group membership: a stable id unique in the group (a StatefulSet
                                      pod's name) lets a restarted dispatcher resume at once [unset: dynamic]
      HERALD_ACTIVITY_TTL_SECONDS     Live Activity registration lifetime [\(defaults.activityTTL.secondsText)]
      HERALD_JOB_STATUS_TTL_SECONDS   how long a job's status can be read [\(defaults.jobStatusTTL.secondsText)]
      HERALD_APNS_PRODUCTION_URL      [https://api.push.apple.com]
      HERALD_APNS_SANDBOX_URL         [https://api.sandbox.push.apple.com]
      HERALD_APNS_CA_FILE             extra trusted root (PEM), e.g. the simulator's ca.pem [none]
      HERALD_APNS_MANAGE_PRODUCTION_URL  broadcast channel management [https://api-manage-broadcast.push.apple.com:2196]
      HERALD_APNS_MANAGE_SANDBOX_URL     [https://api-manage-broadcast.sandbox.push.apple.com:2195]
      HERALD_APNS_BROADCAST_PRODUCTION_URL / _SANDBOX_URL  where broadcasts are published [the push URLs]
      HERALD_APNS_CONNECTIONS         connections per app and environment [\(APNsConfiguration().connectionsPerEndpoint)]
      HERALD_RETRY_MAX_ATTEMPTS       attempts per push, the first included [\(defaults.maxAttempts)]
      HERALD_RETRY_INITIAL_DELAY_SECONDS  backoff before the second attempt, doubling, jittered [\(defaults.retryInitialDelay.secondsText)]
      HERALD_MAX_IN_FLIGHT_PUSHES     pushes awaiting APNs at once [\(defaults.maxInFlightPushes)]
      HERALD_FANOUT_BATCH_SIZE        subscriptions read per Redis batch [\(defaults.batchSize)]
      HERALD_MAX_JOB_BYTES            larger job records are dead-lettered unread [\(defaults.maxJobBytes)]
      HERALD_KAFKA_SESSION_TIMEOUT_SECONDS  consumer-group session timeout [\(defaults.sessionTimeout.secondsText)]
      HERALD_KAFKA_MAX_POLL_INTERVAL_SECONDS  [\(defaults.maxPollInterval.secondsText)]
      HERALD_KAFKA_FETCH_MAX_WAIT_MS  how long the broker may hold an empty fetch (latency vs idle fetches) [\(defaults.fetchMaxWait.inMilliseconds)]
      HERALD_KAFKA_FETCH_STALL_SECONDS  for the development broker (Tansu): no records for this long with more on
                                      the broker restarts the consumer with a 4x fetch wait [unset: off]
      HERALD_BROADCAST_IDLE_SECONDS   a post's broadcast channels are deleted after this long without a create or update [\(defaults.broadcastIdle.secondsText)]
      HERALD_BROADCAST_JANITOR_INTERVAL_SECONDS  how often idle, orphaned and vanished channels are cleaned up [\(defaults.broadcastJanitorInterval.secondsText)]
      HERALD_DRAIN_TIMEOUT_SECONDS    on SIGTERM, time in-flight jobs get to finish [\(defaults.drainTimeout.secondsText)]
      HERALD_LOG_LEVEL                debug | info | warning | error [info]
      HERALD_ACCESS_LOG               on | off: a "request" line per probe or metrics scrape at info [on]
    """

struct DispatcherSettings {
    var configuration = DispatcherConfiguration()
    var apns = APNsConfiguration()
    var appsFile: String
    var redis: RedisConfiguration
    var producer: KafkaProducerConfiguration
    var logLevel: Logger.Level

    init(_ env: EnvironmentReader) throws {
        configuration.address = try env.address("HERALD_DISPATCHER_ADDR", default: defaults.address.description)
        configuration.jobsTopic = env.string("HERALD_TOPIC_JOBS", default: defaults.jobsTopic)
        configuration.deadLetterTopic = env.string("HERALD_TOPIC_DLQ", default: defaults.deadLetterTopic)
        configuration.consumerGroup = env.string("HERALD_CONSUMER_GROUP", default: defaults.consumerGroup)
        configuration.activityTTL = .seconds(try env.int("HERALD_ACTIVITY_TTL_SECONDS", default: Int(defaults.activityTTL.components.seconds),
                                                          range: 1...86_400 * 30))
        configuration.jobStatusTTL = .seconds(try env.int("HERALD_JOB_STATUS_TTL_SECONDS",
                                                          default: Int(defaults.jobStatusTTL.components.seconds),
                                                          range: 60...86_400 * 30))
        configuration.maxAttempts = try env.int("HERALD_RETRY_MAX_ATTEMPTS", default: defaults.maxAttempts, range: 1...100)
        configuration.retryInitialDelay = try env.seconds("HERALD_RETRY_INITIAL_DELAY_SECONDS", default: defaults.retryInitialDelay)
        configuration.maxInFlightPushes = try env.int("HERALD_MAX_IN_FLIGHT_PUSHES", default: defaults.maxInFlightPushes, range: 1...100_000)
        configuration.batchSize = try env.int("HERALD_FANOUT_BATCH_SIZE", default: defaults.batchSize, range: 1...100_000)
        configuration.maxJobBytes = try env.int("HERALD_MAX_JOB_BYTES", default: defaults.maxJobBytes, range: 1024...16 * 1024 * 1024)
        configuration.jobSigning = try JobSigning(env)
        configuration.sessionTimeout = try env.seconds("HERALD_KAFKA_SESSION_TIMEOUT_SECONDS", default: defaults.sessionTimeout)
        configuration.consumerInstanceID = env.optionalString("HERALD_CONSUMER_INSTANCE_ID")
        configuration.maxPollInterval = try env.seconds("HERALD_KAFKA_MAX_POLL_INTERVAL_SECONDS", default: defaults.maxPollInterval)
        configuration.fetchMaxWait = .milliseconds(try env.int("HERALD_KAFKA_FETCH_MAX_WAIT_MS", default: Int(defaults.fetchMaxWait.inMilliseconds), range: 1...5000))
        if let stallTimeout = try env.optionalSeconds("HERALD_KAFKA_FETCH_STALL_SECONDS"), stallTimeout > .zero {
            configuration.fetchStallRecovery = FetchStallRecovery(stallTimeout: stallTimeout)
        }
        configuration.drainTimeout = try env.seconds("HERALD_DRAIN_TIMEOUT_SECONDS", default: defaults.drainTimeout)
        configuration.broadcastIdle = try env.seconds("HERALD_BROADCAST_IDLE_SECONDS", default: defaults.broadcastIdle)
        configuration.broadcastJanitorInterval = try env.seconds("HERALD_BROADCAST_JANITOR_INTERVAL_SECONDS",
                                                                 default: defaults.broadcastJanitorInterval)
        guard configuration.broadcastJanitorInterval > .zero else {
            throw ConfigurationError("HERALD_BROADCAST_JANITOR_INTERVAL_SECONDS", "expected more than 0 seconds")
        }
        configuration.accessLog = try env.flag("HERALD_ACCESS_LOG", default: defaults.accessLog)
        configuration.kafka = try KafkaConfiguration(environment: env, clientID: "herald-dispatcher")
        var deadLetterClient = configuration.kafka
        deadLetterClient.clientID = "herald-dispatcher-dlq"
        producer = KafkaProducerConfiguration(kafka: deadLetterClient, messageTimeout: .seconds(10))
        apns = try APNsConfiguration(environment: env)
        apns.connectionsPerEndpoint = try env.int("HERALD_APNS_CONNECTIONS", default: apns.connectionsPerEndpoint, range: 1...64)
        appsFile = env.string("HERALD_APPS_FILE", default: "config/apps.json")
        redis = try RedisConfiguration(environment: env)
        logLevel = try env.logLevel()
    }
}

func main() async {
    if CommandLineTool.helpRequested() { CommandLineTool.exitWithUsage(usage) }
    CoreDumps.disable() // it holds the apps' APNs signing keys
    let settings: DispatcherSettings
    let apps: AppRegistry
    do {
        settings = try DispatcherSettings(EnvironmentReader())
        apps = try AppRegistry(loading: settings.appsFile, for: .dispatcher)
    } catch { CommandLineTool.exitWithConfigurationError("herald-dispatcher", error) }

    let logger = Logger(label: "herald.dispatcher", minimumLevel: settings.logLevel)
    CrashReport.install(label: "herald.dispatcher")
    let redis = RedisClient(configuration: settings.redis, logger: logger.with(["component": "redis"]))
    let producer: KafkaProducer
    let apns: APNsClient
    let service: DispatcherService
    do {
        producer = try KafkaProducer(configuration: settings.producer, logger: logger.with(["component": "kafka"]))
        apns = try APNsClient(configuration: settings.apns, logger: logger.with(["component": "apns"]))
        service = try DispatcherService(configuration: settings.configuration, apps: apps, redis: redis,
                                        producer: producer, apns: apns, logger: logger)
    } catch { CommandLineTool.exitWithConfigurationError("herald-dispatcher", error) }

    if case .unverified = settings.configuration.jobSigning { logger.warning(JobSigning.unverifiedWarning) }
    logger.info("started", ["addr": service.address.description, "apps": "\(apps.directory.apps.count)",
                            "group": settings.configuration.consumerGroup, "topic": settings.configuration.jobsTopic,
                            "group.instance": settings.configuration.consumerInstanceID ?? "none",
                            "session_timeout_s": settings.configuration.sessionTimeout.secondsText,
                            "redis.addr": settings.redis.description]
                    .merging(settings.configuration.kafka.security.logFields) { first, _ in first })
    var failed = false
    do {
        // The drain (≤ HERALD_DRAIN_TIMEOUT_SECONDS + a few seconds) fits in the group's 25 s, which fits in
        // Kubernetes' 30 s terminationGracePeriodSeconds.
        let reloader = AppsReloader(apps: apps, path: settings.appsFile, logger: logger)
        try await ServiceGroup(services: [reloader, service], gracePeriod: .seconds(25), logger: logger).run()
    } catch {
        failed = true
        logger.error("stopped with an error", ["error": "\(error)"])
    }
    await apns.shutdown(gracePeriod: .seconds(1))
    await producer.close()
    await redis.close()
    logger.info("stopped")
    if failed { exit(1) }
}

await main()
