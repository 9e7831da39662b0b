import Foundation
import HeraldKafka
import HeraldRedis
import HeraldRuntime

/// Where heraldctl's dead-letter commands find Kafka and Redis (`HERALD_*` variables).
struct Connections: Sendable {
    var brokers: String
    private var environment: EnvironmentReader
    var jobsTopic: String
    var dlqTopic: String
    /// Bound on each metadata or offsets request, so an unreachable broker is reported instead of waited on.
    var requestTimeout: Duration = .seconds(5)

    /// Brokers and security from the environment, checked now (a bad setting exits 2 before anything is read).
    private let kafkaFromEnvironment: KafkaConfiguration

    init(_ env: EnvironmentReader = EnvironmentReader()) throws {
        kafkaFromEnvironment = try KafkaConfiguration(environment: env, clientID: "heraldctl")
        brokers = env.string("HERALD_KAFKA_BROKERS", default: "127.0.0.1:9092")
        environment = env
        jobsTopic = env.string("HERALD_TOPIC_JOBS", default: "herald.jobs")
        dlqTopic = env.string("HERALD_TOPIC_DLQ", default: "herald.dlq")
    }

    /// Only errors reach stderr: a command-line tool's output is its answer, not librdkafka's chatter.
    var logger: Logger { Logger(label: "heraldctl", minimumLevel: .error) }

    var kafka: KafkaConfiguration {
        var configuration = kafkaFromEnvironment
        configuration.requestTimeout = requestTimeout
        configuration.socketTimeout = requestTimeout
        // librdkafka logs every failed connection attempt; the command says in one line what failed instead.
        configuration.properties["log_level"] = "2"
        // A mistyped topic name must be reported, not created (producers ask brokers to create topics by default).
        configuration.properties["allow.auto.create.topics"] = "false"
        return configuration
    }

    func redis() throws -> RedisClient {
        RedisClient(configuration: try RedisConfiguration(environment: environment), logger: logger)
    }

    /// Says what failed in words an operator can act on.
    func explain(_ error: any Error, topic: String? = nil) -> OperatorError {
        if let error = error as? KafkaError {
            switch error.code {
            case .unknownTopicOrPartition:
                return OperatorError("topic \(topic ?? "?") does not exist on \(brokers): check HERALD_TOPIC_DLQ and "
                                     + "HERALD_TOPIC_JOBS, or create the topics with `heraldctl topics create`")
            case .transport, .allBrokersDown, .timedOut:
                return OperatorError("cannot reach Kafka at \(brokers) (\(error.message)): check HERALD_KAFKA_BROKERS "
                                     + "and that the broker is up, then run the command again")
            default:
                return OperatorError("Kafka: \(error.message) (\(error.code.name))")
            }
        }
        if let error = error as? RedisError {
            if error.isConnectionFailure {
                return OperatorError("cannot reach Redis at \(redisDescription) (\(error.message)): check HERALD_REDIS_URL "
                                     + "and that Redis is up, then run the command again")
            }
            return OperatorError("Redis: \(error.message)")
        }
        if let error = error as? OperatorError { return error }
        return OperatorError("\(error)")
    }

    /// The Redis URL without its password.
    private var redisDescription: String {
        (try? RedisConfiguration(environment: environment).description) ?? "HERALD_REDIS_URL"
    }
}

/// A failure the operator can do something about; printed as `heraldctl: <message>`, exit status 1.
struct OperatorError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
