import Foundation
import HeraldRuntime
import HeraldTestSupport
import Testing
@testable import HeraldKafka

/// `HERALD_KAFKA_SECURITY_PROTOCOL` and friends: what is refused at start, and what reaches librdkafka.
@Suite("Kafka security settings")
struct KafkaSecurityTests {
    static let password = "sasl-" + UUID().uuidString

    /// A folder with a password file and the test PKI.
    static func files() throws -> (pki: TestPKI, passwordFile: String) {
        let directory = try scratchDirectory("herald-kafka-security-")
        let passwordFile = directory + "/sasl-password"
        try (password + "\n").write(toFile: passwordFile, atomically: true, encoding: .utf8)
        return (try TestPKI(directory: directory + "/pki"), passwordFile)
    }

    static func error(_ values: [String: String]) -> ConfigurationError? {
        #expect(throws: ConfigurationError.self) { try KafkaSecurity(environment: EnvironmentReader(values)) }
    }

    @Test func saslOverTLSReachesLibrdkafkaUnchanged() async throws {
        let (pki, passwordFile) = try Self.files()
        let env = EnvironmentReader([
            "HERALD_KAFKA_BROKERS": "127.0.0.1:1", "HERALD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "HERALD_KAFKA_SASL_MECHANISM": "scram-sha-512", "HERALD_KAFKA_SASL_USERNAME": "herald",
            "HERALD_KAFKA_SASL_PASSWORD_FILE": passwordFile, "HERALD_KAFKA_SSL_CA_FILE": pki.ca,
            "HERALD_KAFKA_SSL_CERT_FILE": pki.clientCertificate, "HERALD_KAFKA_SSL_KEY_FILE": pki.clientKey,
            "HERALD_KAFKA_PROPERTY_SASL_KERBEROS_MIN_TIME_BEFORE_RELOGIN": "60000",
        ])
        let kafka = try KafkaConfiguration(environment: env, clientID: "herald")
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(kafka: kafka),
                                         logger: Logger(label: "test", minimumLevel: .error))
        // What librdkafka itself reports it runs with, not what we meant to give it.
        let effective = producer.effectiveProperties
        #expect(effective["security.protocol"] == "sasl_ssl")
        #expect(effective["sasl.mechanisms"] == "SCRAM-SHA-512")
        #expect(effective["sasl.username"] == "herald")
        #expect(effective["ssl.ca.location"] == pki.ca)
        #expect(effective["ssl.certificate.location"] == pki.clientCertificate)
        #expect(effective["ssl.key.location"] == pki.clientKey)
        #expect(effective["enable.ssl.certificate.verification"] == "true")
        #expect(effective["ssl.endpoint.identification.algorithm"] == "https")
        #expect(effective["sasl.kerberos.min.time.before.relogin"] == "60000")
        #expect(effective["sasl.password"] != nil)
        #expect(effective["enable.idempotence"] == "true")
        await producer.close()

        // The password is in librdkafka's configuration only: not in any text Herald prints.
        for text in ["\(kafka)", String(describing: kafka.security), "\(kafka.security.logFields)", String(reflecting: kafka)] {
            #expect(!text.contains(Self.password))
        }
        #expect(kafka.security.logFields["kafka.security.protocol"] == "sasl_ssl")
        #expect(kafka.security.logFields["kafka.sasl.mechanism"] == "SCRAM-SHA-512")
    }

    @Test func mistakesAreRefusedWithTheVariableNamed() throws {
        let (pki, passwordFile) = try Self.files()
        let sasl = ["HERALD_KAFKA_SECURITY_PROTOCOL": "sasl_plaintext", "HERALD_KAFKA_SASL_MECHANISM": "PLAIN",
                    "HERALD_KAFKA_SASL_USERNAME": "herald", "HERALD_KAFKA_SASL_PASSWORD_FILE": passwordFile]
        let cases: [([String: String], String, String)] = [
            (["HERALD_KAFKA_SECURITY_PROTOCOL": "tls"], "HERALD_KAFKA_SECURITY_PROTOCOL", "sasl_ssl"),
            (sasl.merging(["HERALD_KAFKA_SASL_MECHANISM": "GSSAPI"]) { $1 }, "HERALD_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256"),
            (sasl.filter { $0.key != "HERALD_KAFKA_SASL_MECHANISM" }, "HERALD_KAFKA_SASL_MECHANISM", "required"),
            (sasl.filter { $0.key != "HERALD_KAFKA_SASL_PASSWORD_FILE" }, "HERALD_KAFKA_SASL_PASSWORD_FILE", "required"),
            (sasl.merging(["HERALD_KAFKA_SASL_PASSWORD_FILE": "/nonexistent"]) { $1 }, "HERALD_KAFKA_SASL_PASSWORD_FILE", "cannot read"),
            (["HERALD_KAFKA_SASL_USERNAME": "herald"], "HERALD_KAFKA_SASL_USERNAME", "SECURITY_PROTOCOL"),
            // TLS files with a clear-text protocol would silently be ignored.
            (["HERALD_KAFKA_SSL_CA_FILE": pki.ca], "HERALD_KAFKA_SSL_CA_FILE", "ssl or sasl_ssl"),
            (["HERALD_KAFKA_SECURITY_PROTOCOL": "ssl", "HERALD_KAFKA_SSL_CA_FILE": "/nonexistent/ca.pem"],
             "HERALD_KAFKA_SSL_CA_FILE", "cannot read"),
            (["HERALD_KAFKA_SECURITY_PROTOCOL": "ssl", "HERALD_KAFKA_SSL_CERT_FILE": pki.clientCertificate],
             "HERALD_KAFKA_SSL_CERT_FILE", "both"),
            // Verification cannot be turned off, secrets cannot come through the environment.
            (["HERALD_KAFKA_PROPERTY_ENABLE_SSL_CERTIFICATE_VERIFICATION": "false"],
             "HERALD_KAFKA_PROPERTY_ENABLE_SSL_CERTIFICATE_VERIFICATION", "cannot be turned off"),
            (["HERALD_KAFKA_PROPERTY_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": "none"],
             "HERALD_KAFKA_PROPERTY_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM", "cannot be turned off"),
            (["HERALD_KAFKA_PROPERTY_SASL_PASSWORD": Self.password], "HERALD_KAFKA_PROPERTY_SASL_PASSWORD", "HERALD_KAFKA_*"),
            (["HERALD_KAFKA_PROPERTY_ENABLE_AUTO_COMMIT": "true"], "HERALD_KAFKA_PROPERTY_ENABLE_AUTO_COMMIT", "at-least-once"),
            // A send waits for its record's delivery report: one never sent, or never timed out, would hang it.
            (["HERALD_KAFKA_PROPERTY_DELIVERY_REPORT_ONLY_ERROR": "true"],
             "HERALD_KAFKA_PROPERTY_DELIVERY_REPORT_ONLY_ERROR", "at-least-once"),
            (["HERALD_KAFKA_PROPERTY_MESSAGE_TIMEOUT_MS": "0"], "HERALD_KAFKA_PROPERTY_MESSAGE_TIMEOUT_MS", "at-least-once"),
            (["HERALD_KAFKA_PROPERTY_GROUP_INSTANCE_ID": "a"], "HERALD_KAFKA_PROPERTY_GROUP_INSTANCE_ID",
             "HERALD_CONSUMER_INSTANCE_ID"),
            // librdkafka's own verdict on a property it does not know or a value it refuses.
            (["HERALD_KAFKA_PROPERTY_NO_SUCH_THING": "1"], "HERALD_KAFKA_PROPERTY_NO_SUCH_THING", "no.such.thing"),
            (["HERALD_KAFKA_PROPERTY_LINGER_MS": "soon"], "HERALD_KAFKA_PROPERTY_LINGER_MS", "linger.ms"),
        ]
        for (values, variable, words) in cases {
            let error = Self.error(values)
            #expect(error?.variable.hasPrefix(variable) == true, "\(values): \(String(describing: error))")
            #expect(error?.message.contains(words) == true, "\(values): \(error?.message ?? "accepted")")
            #expect(error?.description.contains(Self.password) == false)
        }
    }

    @Test func propertiesFileAndVariablesPassThrough() throws {
        let directory = try scratchDirectory("herald-kafka-properties-")
        let file = directory + "/client.properties"
        try "# tuned for a managed cluster\nsocket.keepalive.enable = true\n\nmetadata.max.age.ms=60000\n"
            .write(toFile: file, atomically: true, encoding: .utf8)
        let security = try KafkaSecurity(environment: EnvironmentReader([
            "HERALD_KAFKA_PROPERTIES_FILE": file, "HERALD_KAFKA_PROPERTY_METADATA_MAX_AGE_MS": "30000",
        ]))
        // A variable wins over the file; both win over Herald's own settings.
        #expect(security.extraProperties == ["socket.keepalive.enable": "true", "metadata.max.age.ms": "30000"])
        var kafka = KafkaConfiguration(brokers: ["a:1"])
        kafka.security = security
        #expect(KafkaProducerConfiguration(kafka: kafka).librdkafkaProperties["metadata.max.age.ms"] == "30000")
        #expect(kafka.librdkafkaProperties["security.protocol"] == "plaintext")

        try "socket.keepalive.enable\n".write(toFile: file, atomically: true, encoding: .utf8)
        let error = Self.error(["HERALD_KAFKA_PROPERTIES_FILE": file])
        #expect(error?.variable == "HERALD_KAFKA_PROPERTIES_FILE" && error?.message.contains("line 1") == true)
    }
}
