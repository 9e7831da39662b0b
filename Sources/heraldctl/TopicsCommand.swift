import HeraldKafka
import HeraldRuntime

/// `heraldctl topics create`: the jobs and dead-letter topics.
enum TopicsCommand {
    static func create(_ flags: Flags) async throws {
        let env = EnvironmentReader()
        let partitions = try flags.int("partitions", default: 12, range: 1...10_000)
        let replication = try flags.int("replication-factor", default: 1, range: 1...10)
        let admin = try KafkaAdmin(configuration: KafkaConfiguration(environment: env, clientID: "heraldctl"),
                                   logger: Logger(label: "heraldctl", minimumLevel: .warning))
        defer { admin.close() }
        for topic in [env.string("HERALD_TOPIC_JOBS", default: "herald.jobs"),
                      env.string("HERALD_TOPIC_DLQ", default: "herald.dlq")] {
            try await admin.createTopic(topic, partitions: partitions, replicationFactor: replication, ifNotExists: true)
            let count = try await admin.partitionCount(topic: topic)
            print("\(topic): \(count) partitions")
        }
    }
}
