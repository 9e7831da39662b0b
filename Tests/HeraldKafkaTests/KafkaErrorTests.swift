import Testing
@testable import HeraldKafka

@Suite("Kafka error classification")
struct KafkaErrorTests {
    @Test func transientConditionsAreRetriable() {
        for code in [KafkaError.Code.queueFull, .messageTimedOut, .timedOut, .transport, .allBrokersDown,
                     .unknownTopicOrPartition, .purgedFromQueue] {
            let error = KafkaError(code: code)
            #expect(error.isRetriable, "\(code)")
            #expect(!error.isFatal, "\(code)")
        }
    }

    @Test func permanentConditionsAreNotRetriable() {
        for code in [KafkaError.Code.invalidArgument, .topicAlreadyExists, .messageTooLarge, .destroyed] {
            #expect(!KafkaError(code: code).isRetriable, "\(code)")
        }
    }

    @Test func fatalIsNeverRetriable() {
        let error = KafkaError(code: .fatal, message: "OUT_OF_ORDER_SEQUENCE_NUMBER: gap")
        #expect(error.isFatal)
        #expect(!error.isRetriable)
        #expect(error.description == "KafkaError(_FATAL, fatal): OUT_OF_ORDER_SEQUENCE_NUMBER: gap")
    }

    @Test func codesCarryLibrdkafkaNamesAndText() {
        #expect(KafkaError.Code.queueFull.name == "_QUEUE_FULL")
        #expect(KafkaError.Code.queueFull.rawValue == -184)
        #expect(KafkaError.Code(rawValue: 19).name == "NOT_ENOUGH_REPLICAS")
        #expect(KafkaError.Code(rawValue: 19).isRetriable)
        #expect(KafkaError(code: .messageTimedOut).message == "Local: Message timed out")
    }

    @Test func explicitClassificationWins() {
        let error = KafkaError(code: .transport, isRetriable: false)
        #expect(!error.isRetriable)
    }
}
