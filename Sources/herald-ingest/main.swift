import Foundation
import HeraldCore
import HeraldIngest
import HeraldKafka
import HeraldRedis
import HeraldRuntime

let defaults = IngestConfiguration()
let usage = """
    herald-ingest — Herald's HTTP API: device subscriptions, Live Activity registration, event intake → Kafka.

    Usage: herald-ingest [--help]

    Environment (defaults in brackets):
      HERALD_INGEST_ADDR            listen address [\(defaults.address)]
      HERALD_INGEST_ADMIN_ADDR      serve /metrics here instead of on the API address (/healthz and /readyz on both) [unset]
      HERALD_APPS_FILE              apps file [config/apps.json]; SIGHUP reloads it
      HERALD_JOB_SIGNING_SECRET_FILE  the deployment's job-signing secret; required unless
                                    HERALD_JOB_SIGNATURES=unverified (jobs are then not signed)
    \(RedisConfiguration.usage)
      HERALD_REDIS_CONNECTIONS      Redis connections off the HTTP loops (each loop has its own) [1]
      HERALD_KAFKA_BROKERS          [127.0.0.1:9092]
    \(KafkaSecurity.usage)
      HERALD_KAFKA_LINGER_MS        how long the producer gathers a batch (linger.ms) [3]
      HERALD_TOPIC_JOBS             [\(defaults.jobsTopic)]
      HERALD_RATE_LIMIT_PER_MINUTE  requests per minute per credential, or per device of a public key [\(defaults.rateLimitPerMinute)]
      HERALD_APP_RATE_LIMIT_PER_MINUTE  requests per minute of one public key, all devices [\(defaults.appRateLimitPerMinute)]
      HERALD_ACTIVITY_TTL_SECONDS   Live Activity registration lifetime [\(defaults.activityTTL.secondsText)]
      HERALD_JOB_STATUS_TTL_SECONDS  how long a job's status can be read [\(defaults.jobStatusTTL.secondsText)]
      HERALD_BROADCAST_CHANNEL_WAIT_SECONDS  how long POST …/broadcast waits for the dispatcher to make the channel [\(defaults.broadcastChannelWait.secondsText)]
      HERALD_MAX_SUBSCRIPTIONS_PER_DEVICE  subscriptions per device token; more get 409 [\(defaults.maxSubscriptionsPerDevice)]
      HERALD_SUBSCRIPTION_TTL_DAYS  a subscription not renewed for this long ends; 0 = never [90]
      HERALD_MAX_BODY_BYTES         largest request body [\(defaults.maxBodyBytes)]
      HERALD_PUBLISH_TIMEOUT_SECONDS  how long a job may wait for the broker's ack (then 503) [\(defaults.publishTimeout.secondsText)]
      HERALD_HTTP_THREADS           HTTP worker loops (threads), one per core to use [\(defaults.threads)]
      HERALD_HTTP_IDLE_TIMEOUT_SECONDS  close a connection with no traffic for this long [\(defaults.idleTimeout.secondsText)]
      HERALD_HTTP_READ_TIMEOUT_SECONDS  a whole request must arrive within this long [\(defaults.readTimeout.secondsText)]
      HERALD_HTTP_MAX_CONNECTIONS   open connections; more wait in the accept queue [\(defaults.maxConnections)]
      HERALD_HTTP_MAX_CONNECTIONS_PER_IP  open connections per client address, 0 = unlimited [\(defaults.maxConnectionsPerAddress)]
      HERALD_HTTP_IPV6_PREFIX_LENGTH  IPv6 clients count per network of this prefix (1-128) [\(defaults.ipv6PrefixLength)]
      HERALD_LOG_LEVEL              debug | info | warning | error [info]
      HERALD_ACCESS_LOG             on | off: a "request" line per request at info [on]
      GLIBC_TUNABLES                when unset, set to glibc.malloc.tcache_count=64 (a larger malloc cache)
    """

struct IngestSettings {
    var configuration = IngestConfiguration()
    var appsFile: String
    var redis: RedisConfiguration
    var kafka: KafkaProducerConfiguration
    var logLevel: Logger.Level

    init(_ env: EnvironmentReader) throws {
        configuration.address = try env.address("HERALD_INGEST_ADDR", default: defaults.address.description)
        if env.optionalString("HERALD_INGEST_ADMIN_ADDR") != nil {
            configuration.adminAddress = try env.address("HERALD_INGEST_ADMIN_ADDR", default: "")
        }
        configuration.rateLimitPerMinute = try env.int("HERALD_RATE_LIMIT_PER_MINUTE", default: defaults.rateLimitPerMinute, range: 1...1_000_000)
        configuration.appRateLimitPerMinute = try env.int("HERALD_APP_RATE_LIMIT_PER_MINUTE", default: defaults.appRateLimitPerMinute,
                                                          range: 1...100_000_000)
        configuration.activityTTL = .seconds(try env.int("HERALD_ACTIVITY_TTL_SECONDS", default: Int(defaults.activityTTL.components.seconds),
                                                          range: 1...86_400 * 30))
        configuration.broadcastChannelWait = .seconds(try env.int("HERALD_BROADCAST_CHANNEL_WAIT_SECONDS",
                                                                  default: Int(defaults.broadcastChannelWait.components.seconds),
                                                                  range: 1...60))
        configuration.jobStatusTTL = .seconds(try env.int("HERALD_JOB_STATUS_TTL_SECONDS",
                                                          default: Int(defaults.jobStatusTTL.components.seconds),
                                                          range: 60...86_400 * 30))
        configuration.maxSubscriptionsPerDevice = try env.int("HERALD_MAX_SUBSCRIPTIONS_PER_DEVICE",
                                                              default: defaults.maxSubscriptionsPerDevice, range: 1...100_000)
        let ttlDays = try env.int("HERALD_SUBSCRIPTION_TTL_DAYS", default: 90, range: 0...3650)
        configuration.subscriptionTTL = ttlDays == 0 ? nil : .seconds(ttlDays * 86_400)
        configuration.maxBodyBytes = try env.int("HERALD_MAX_BODY_BYTES", default: defaults.maxBodyBytes, range: 1024...16 << 20)
        configuration.jobsTopic = env.string("HERALD_TOPIC_JOBS", default: defaults.jobsTopic)
        configuration.jobSigning = try JobSigning(env)
        configuration.publishTimeout = try env.seconds("HERALD_PUBLISH_TIMEOUT_SECONDS", default: defaults.publishTimeout)
        configuration.accessLog = try env.flag("HERALD_ACCESS_LOG", default: defaults.accessLog)
        configuration.threads = try env.int("HERALD_HTTP_THREADS", default: defaults.threads, range: 1...64)
        configuration.idleTimeout = try env.seconds("HERALD_HTTP_IDLE_TIMEOUT_SECONDS", default: defaults.idleTimeout)
        configuration.readTimeout = try env.seconds("HERALD_HTTP_READ_TIMEOUT_SECONDS", default: defaults.readTimeout)
        configuration.maxConnections = try env.int("HERALD_HTTP_MAX_CONNECTIONS", default: defaults.maxConnections, range: 1...1_000_000)
        configuration.maxConnectionsPerAddress = try env.int("HERALD_HTTP_MAX_CONNECTIONS_PER_IP", default: defaults.maxConnectionsPerAddress,
                                                             range: 0...1_000_000)
        configuration.ipv6PrefixLength = try env.int("HERALD_HTTP_IPV6_PREFIX_LENGTH", default: defaults.ipv6PrefixLength,
                                                     range: 1...128)
        appsFile = env.string("HERALD_APPS_FILE", default: "config/apps.json")
        // One connection by default: concurrent calls then share one write and one read loop (automatic
        // pipelining); more connections cost more CPU per request in both herald-ingest and Redis.
        let connections = try env.int("HERALD_REDIS_CONNECTIONS", default: 1, range: 1...64)
        redis = try RedisConfiguration(environment: env, poolSize: connections)
        // 3 ms, not librdkafka's usual 1 ms: under load each produce request then carries several jobs per
        // partition (less ingest and broker CPU per event). Not more: each answer waits for its ack, so with few
        // concurrent callers the linger bounds throughput.
        let linger = try env.int("HERALD_KAFKA_LINGER_MS", default: 3, range: 0...1000)
        kafka = KafkaProducerConfiguration(kafka: try KafkaConfiguration(environment: env, clientID: "herald"),
                                           messageTimeout: configuration.publishTimeout, linger: .milliseconds(linger))
        logLevel = try env.logLevel()
    }
}

func main() async {
    if CommandLineTool.helpRequested() { CommandLineTool.exitWithUsage(usage) }
    MallocCache.enlargeByReexecuting()
    CoreDumps.disable() // it holds the apps' OAuth verification keys and its Redis and Kafka credentials
    let settings: IngestSettings
    let apps: AppRegistry
    do {
        settings = try IngestSettings(EnvironmentReader())
        apps = try AppRegistry(loading: settings.appsFile, for: .ingest)
    } catch { CommandLineTool.exitWithConfigurationError("herald-ingest", error) }

    let logger = Logger(label: "herald.ingest", minimumLevel: settings.logLevel)
    CrashReport.install(label: "herald.ingest")
    let redis = RedisClient(configuration: settings.redis, logger: logger.with(["component": "redis"]))
    let producer: KafkaProducer
    let service: IngestService
    do {
        producer = try KafkaProducer(configuration: settings.kafka, logger: logger.with(["component": "kafka"]))
        service = try IngestService(configuration: settings.configuration, apps: apps, redis: redis,
                                    producer: producer, logger: logger)
    } catch { CommandLineTool.exitWithConfigurationError("herald-ingest", error) }

    if case .unverified = settings.configuration.jobSigning { logger.warning(JobSigning.unverifiedWarning) }
    logger.info("listening", ["addr": service.address.description, "admin.addr": service.adminAddress?.description ?? "",
                              "apps": "\(apps.directory.apps.count)", "redis.addr": settings.redis.description]
                    .merging(settings.kafka.kafka.security.logFields) { first, _ in first })
    let reloader = AppsReloader(apps: apps, path: settings.appsFile, logger: logger)
    var failed = false
    do {
        try await ServiceGroup(services: [reloader, service], logger: logger).run()
    } catch {
        failed = true
        logger.error("stopped with an error", ["error": "\(error)"])
    }
    await producer.close()
    await redis.close()
    logger.info("stopped")
    if failed { exit(1) }
}

await main()
