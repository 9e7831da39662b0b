import CRdKafka
import Foundation
@testable import HeraldKafka
import Testing
import HeraldTestSupport

/// librdkafka's in-process mock cluster: a real Kafka protocol server on loopback with fault injection.
final class MockCluster {
    private let owner: OpaquePointer
    private let cluster: OpaquePointer
    let bootstraps: String

    init(topic: String) throws {
        let conf = rd_kafka_conf_new()
        // The mock cluster's own client would log as plain text; its lines are of no interest here.
        rd_kafka_conf_set_log_cb(conf) { _, _, _, _ in }
        var errorText = [CChar](repeating: 0, count: 256)
        owner = try #require(rd_kafka_new(RD_KAFKA_PRODUCER, conf, &errorText, errorText.count))
        cluster = try #require(rd_kafka_mock_cluster_new(owner, 1))
        bootstraps = String(cString: rd_kafka_mock_cluster_bootstraps(cluster))
        #expect(rd_kafka_mock_topic_create(cluster, topic, 1, 1) == RD_KAFKA_RESP_ERR_NO_ERROR)
    }

    deinit {
        rd_kafka_mock_cluster_destroy(cluster)
        rd_kafka_destroy(owner)
    }

    /// The next `errors.count` Produce requests fail with these broker errors.
    func failProduceRequests(_ errors: [rd_kafka_resp_err_t]) {
        rd_kafka_mock_push_request_errors_array(cluster, 0 /* ApiKey Produce */, errors.count, errors)
    }
}

@Suite("Kafka producer against librdkafka's mock cluster")
struct KafkaMockClusterTests {
    private func producer(_ cluster: MockCluster) throws -> KafkaProducer {
        let kafka = KafkaConfiguration(brokers: [cluster.bootstraps],
                                       properties: ["retry.backoff.ms": "10", "retry.backoff.max.ms": "50"])
        return try KafkaProducer(configuration: KafkaProducerConfiguration(kafka: kafka, messageTimeout: .seconds(10)),
                                 logger: testLogger)
    }

    @Test func transientBrokerErrorsAreRetriedUntilAcknowledged() async throws {
        let cluster = try MockCluster(topic: "jobs")
        let producer = try producer(cluster)
        _ = try await producer.send(topic: "jobs", key: "warm", value: [0])
        cluster.failProduceRequests([RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                                     RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT])
        let report = try await producer.send(topic: "jobs", key: "k", value: [1, 2, 3])
        #expect(report == KafkaDeliveryReport(topic: "jobs", partition: 0, offset: 1))
        await producer.close()
        withExtendedLifetime(cluster) {} // the cluster must outlive the producer's connections
    }

    /// A fatal error (here raised by librdkafka's test hook, as an idempotence violation would) fails the sends
    /// queued on the handle; the sends that see it at once ask for one replacement between them, and the next
    /// send goes out on the fresh handle.
    @Test func aFatalErrorReplacesTheHandleOnce() async throws {
        let cluster = try MockCluster(topic: "jobs")
        let producer = try producer(cluster)
        _ = try await producer.send(topic: "jobs", key: "warm", value: [0])
        #expect(rd_kafka_test_fatal_error(producer.currentHandle.handle, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                                          "raised by the test") == RD_KAFKA_RESP_ERR_NO_ERROR)
        let outcomes = await withTaskGroup(of: KafkaError?.self) { group in
            for index in 0..<20 {
                group.addTask {
                    do { _ = try await producer.send(topic: "jobs", key: "k\(index)", value: [1]); return nil }
                    catch { return error as? KafkaError ?? KafkaError(code: .invalidArgument, message: "\(error)") }
                }
            }
            return await group.reduce(into: [KafkaError?]()) { $0.append($1) }
        }
        #expect(outcomes.contains { $0?.isFatal == true }, "\(outcomes)")
        try await eventually("the handle replaced", timeout: .seconds(10)) { producer.currentHandle.generation >= 1 }
        let report = try await producer.send(topic: "jobs", key: "after", value: [2])
        #expect(report.topic == "jobs")
        #expect(producer.currentHandle.generation == 1, "one replacement, not one per refused send")
        await producer.close()
        withExtendedLifetime(cluster) {}
    }

    @Test func aPermanentBrokerErrorFailsTheSendAtOnceWithItsCode() async throws {
        let cluster = try MockCluster(topic: "jobs")
        let producer = try producer(cluster)
        _ = try await producer.send(topic: "jobs", key: "warm", value: [0])
        cluster.failProduceRequests([RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE])
        let clock = ContinuousClock()
        let start = clock.now
        do {
            _ = try await producer.send(topic: "jobs", key: "k", value: [1, 2, 3])
            Issue.record("the broker refused the record")
        } catch {
            #expect(error.code == .messageTooLarge)
            #expect(!error.isRetriable)
            #expect(!error.isFatal)
        }
        #expect(clock.now - start < .seconds(5), "not left to the message timeout")
        await producer.close()
        withExtendedLifetime(cluster) {} // the cluster must outlive the producer's connections
    }
}
