internal import CRdKafka

/// Asks librdkafka whether it takes a property, without making a client: a pass-through property it does not
/// know, or a value it refuses, is reported at start with the property named.
enum RDKafkaConfigurationCheck {
    /// librdkafka's reason for refusing `name=value`; nil when it takes it.
    static func rejection(of name: String, value: String) -> String? {
        guard let conf = rd_kafka_conf_new() else { return "out of memory" }
        defer { rd_kafka_conf_destroy(conf) }
        var errorText = [CChar](repeating: 0, count: 512)
        guard rd_kafka_conf_set(conf, name, value, &errorText, errorText.count) != RD_KAFKA_CONF_OK else { return nil }
        // librdkafka's text may quote the value: not for a property that holds a secret.
        let secret = ["password", "secret", "token", "jaas"].contains { name.contains($0) }
        return secret ? "librdkafka refused the value" : cText(errorText)
    }
}
