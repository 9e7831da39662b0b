import Testing
@testable import HeraldKafka

@Suite("Kafka configuration mapping")
struct KafkaConfigurationTests {
    @Test func producerDefaultsAreIdempotentBoundedAndLowLatency() {
        let properties = KafkaProducerConfiguration(kafka: KafkaConfiguration(brokers: ["a:9092", "b:9093"]))
            .librdkafkaProperties
        #expect(properties["bootstrap.servers"] == "a:9092,b:9093")
        #expect(properties["client.id"] == "herald")
        #expect(properties["enable.idempotence"] == "true")
        #expect(properties["acks"] == "all")
        #expect(properties["message.timeout.ms"] == "5000")
        #expect(properties["linger.ms"] == "1")
        #expect(properties["queue.buffering.max.messages"] == "100000")
        #expect(properties["queue.buffering.max.kbytes"] == "65536")
        #expect(properties["socket.timeout.ms"] == "10000")
    }

    @Test func durationsBecomeMilliseconds() {
        let properties = KafkaProducerConfiguration(kafka: KafkaConfiguration(brokers: ["a:1"]),
                                                    messageTimeout: .milliseconds(1500), linger: .microseconds(500))
            .librdkafkaProperties
        #expect(properties["message.timeout.ms"] == "1500")
        #expect(properties["linger.ms"] == "0.5")
        #expect(Duration.seconds(2).timeoutMilliseconds == 2000)
        #expect(Duration.seconds(Int64.max).timeoutMilliseconds == Int32.max)
    }

    @Test func extraPropertiesOverrideEverything() {
        let kafka = KafkaConfiguration(brokers: ["a:1"], clientID: "ingest",
                                       properties: ["linger.ms": "5", "enable.auto.commit": "true", "debug": "msg"])
        let producer = KafkaProducerConfiguration(kafka: kafka).librdkafkaProperties
        #expect(producer["linger.ms"] == "5")
        #expect(producer["client.id"] == "ingest")
        #expect(producer["debug"] == "msg")
        let consumer = KafkaConsumerConfiguration(kafka: kafka, groupID: "g").librdkafkaProperties
        #expect(consumer["enable.auto.commit"] == "true")
    }

    @Test func consumerCommitsOnlyByHand() {
        let configuration = KafkaConsumerConfiguration(kafka: KafkaConfiguration(brokerList: " a:1 ,b:2,"),
                                                       groupID: "dispatch", sessionTimeout: .seconds(6),
                                                       heartbeatInterval: .milliseconds(500))
        let properties = configuration.librdkafkaProperties
        #expect(configuration.kafka.brokers == ["a:1", "b:2"])
        #expect(properties["group.id"] == "dispatch")
        #expect(properties["enable.auto.commit"] == "false")
        #expect(properties["enable.auto.offset.store"] == "false")
        #expect(properties["auto.offset.reset"] == "earliest")
        #expect(properties["session.timeout.ms"] == "6000")
        #expect(properties["heartbeat.interval.ms"] == "500")
        #expect(properties["enable.idempotence"] == nil)
        #expect(properties["group.instance.id"] == nil, "dynamic membership unless asked")
        var staticMember = configuration
        staticMember.groupInstanceID = "herald-dispatcher-0"
        #expect(staticMember.librdkafkaProperties["group.instance.id"] == "herald-dispatcher-0")
        var groupless = KafkaConsumerConfiguration(kafka: configuration.kafka, groupID: nil, offsetReset: .latest)
        groupless.groupInstanceID = "ignored"
        #expect(groupless.librdkafkaProperties["group.instance.id"] == nil, "only a group member has an instance id")
        #expect(groupless.librdkafkaProperties["group.id"] == KafkaConsumerConfiguration.assignOnlyGroupID)
        #expect(groupless.librdkafkaProperties["auto.offset.reset"] == "latest")
    }
}
