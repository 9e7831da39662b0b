import Foundation
import HeraldCore
import HeraldIngest
import HeraldKafka
import HeraldRedis
import HeraldRuntime

let usage = """
    herald-ingest — Herald's HTTP API: device subscriptions, Live Activity registration, event intake → Kafka.

    Usage: herald-ingest [--help]

    Environment (defaults in brackets):
      HERALD_INGEST_ADDR            listen address [127.0.0.1:8080]
      HERALD_APPS_FILE              apps file [config/apps.json]; SIGHUP reloads it
      HERALD_REDIS_URL              [redis://127.0.0.1:6379/0]
      HERALD_REDIS_CONNECTIONS      Redis connections off the HTTP loops (each loop has its own) [1]
      HERALD_KAFKA_BROKERS          [127.0.0.1:9092]
      HERALD_KAFKA_LINGER_MS        how long the producer gathers a batch (linger.ms) [3]
      HERALD_TOPIC_JOBS             [herald.jobs]
      HERALD_RATE_LIMIT_PER_MINUTE  requests per key per minute [240]
      HERALD_ACTIVITY_TTL_SECONDS   Live Activity registration lifetime [3600]
      HERALD_MAX_BODY_BYTES         largest request body [65536]
      HERALD_PUBLISH_TIMEOUT_SECONDS  wait for the broker's ack before answering 503 [5]
      HERALD_HTTP_THREADS           HTTP worker loops (threads), one per core to use [2]
      HERALD_HTTP_IDLE_TIMEOUT_SECONDS  close a connection with no traffic for this long [30]
      HERALD_HTTP_READ_TIMEOUT_SECONDS  a whole request must arrive within this long [30]
      HERALD_HTTP_MAX_CONNECTIONS   open connections; more wait in the accept queue [1024]
      HERALD_HTTP_MAX_CONNECTIONS_PER_IP  open connections per client address, 0 = unlimited [0]
      HERALD_LOG_LEVEL              debug | info | warning | error [info]
      GLIBC_TUNABLES                when unset, set to glibc.malloc.tcache_count=64 (a larger malloc cache)
    """

struct IngestSettings {
    var configuration = IngestConfiguration()
    var appsFile: String
    var redis: RedisConfiguration
    var kafka: KafkaProducerConfiguration
    var logLevel: Logger.Level

    init(_ env: EnvironmentReader) throws {
        configuration.address = try env.address("HERALD_INGEST_ADDR", default: "127.0.0.1:8080")
        configuration.rateLimitPerMinute = try env.int("HERALD_RATE_LIMIT_PER_MINUTE", default: 240, range: 1...1_000_000)
        configuration.activityTTL = .seconds(try env.int("HERALD_ACTIVITY_TTL_SECONDS", default: 3600, range: 1...86_400 * 30))
        configuration.maxBodyBytes = try env.int("HERALD_MAX_BODY_BYTES", default: 65_536, range: 1024...16 << 20)
        configuration.jobsTopic = env.string("HERALD_TOPIC_JOBS", default: "herald.jobs")
        configuration.publishTimeout = try env.seconds("HERALD_PUBLISH_TIMEOUT_SECONDS", default: .seconds(5))
        configuration.threads = try env.int("HERALD_HTTP_THREADS", default: 2, range: 1...64)
        configuration.idleTimeout = try env.seconds("HERALD_HTTP_IDLE_TIMEOUT_SECONDS", default: .seconds(30))
        configuration.readTimeout = try env.seconds("HERALD_HTTP_READ_TIMEOUT_SECONDS", default: .seconds(30))
        configuration.maxConnections = try env.int("HERALD_HTTP_MAX_CONNECTIONS", default: 1024, range: 1...1_000_000)
        configuration.maxConnectionsPerAddress = try env.int("HERALD_HTTP_MAX_CONNECTIONS_PER_IP", default: 0,
                                                             range: 0...1_000_000)
        appsFile = env.string("HERALD_APPS_FILE", default: "config/apps.json")
        let redisURL = env.string("HERALD_REDIS_URL", default: "redis://127.0.0.1:6379/0")
        // One connection by default: concurrent calls then share one write and one read loop (automatic
        // pipelining); measured with scripts/bench-ingest, 4 connections cost ~25 % more CPU per request in both
        // herald-ingest and Redis for fewer requests per second.
        let connections = try env.int("HERALD_REDIS_CONNECTIONS", default: 1, range: 1...64)
        do { redis = try RedisConfiguration(url: redisURL, poolSize: connections) } catch {
            throw ConfigurationError("HERALD_REDIS_URL", "\(error)")
        }
        let brokers = env.string("HERALD_KAFKA_BROKERS", default: "127.0.0.1:9092")
        // 3 ms, not librdkafka's usual 1 ms: under load each produce request then carries several jobs per
        // partition (less ingest and broker CPU per event). Not 5: each answer waits for its ack, so at 64 callers
        // the linger bounds throughput (9.1k events/s at 5 ms, 14.2k at 3 ms, 10.4k at 1 ms; BENCHMARKS.md).
        let linger = try env.int("HERALD_KAFKA_LINGER_MS", default: 3, range: 0...1000)
        kafka = KafkaProducerConfiguration(kafka: KafkaConfiguration(brokerList: brokers),
                                           messageTimeout: configuration.publishTimeout, linger: .milliseconds(linger))
        logLevel = try env.logLevel()
    }
}

func main() async {
    if CommandLineTool.helpRequested() { CommandLineTool.exitWithUsage(usage) }
    MallocCache.enlargeByReexecuting()
    let settings: IngestSettings
    let apps: AppRegistry
    do {
        settings = try IngestSettings(EnvironmentReader())
        apps = try AppRegistry(loading: settings.appsFile)
    } catch { CommandLineTool.exitWithConfigurationError("herald-ingest", error) }

    let logger = Logger(label: "herald.ingest", minimumLevel: settings.logLevel)
    let redis = RedisClient(configuration: settings.redis, logger: logger.with(["component": "redis"]))
    let producer: KafkaProducer
    let service: IngestService
    do {
        producer = try KafkaProducer(configuration: settings.kafka, logger: logger.with(["component": "kafka"]))
        service = try IngestService(configuration: settings.configuration, apps: apps, redis: redis,
                                    producer: producer, logger: logger)
    } catch { CommandLineTool.exitWithConfigurationError("herald-ingest", error) }

    let reloads = Task { await AppsReloader(apps: apps, path: settings.appsFile, logger: logger).run() }
    logger.info("listening", ["addr": service.address.description, "apps": "\(apps.directory.apps.count)"])
    do {
        try await ServiceGroup(services: [service], logger: logger).run()
    } catch {
        logger.error("stopped with an error", ["error": "\(error)"])
    }
    reloads.cancel()
    await producer.close()
    await redis.close()
    logger.info("stopped")
}

await main()
