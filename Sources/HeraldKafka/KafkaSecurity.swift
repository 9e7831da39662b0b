import Foundation
import HeraldRuntime

/// How Herald's Kafka clients encrypt and authenticate (`security.protocol`, SASL, TLS files), and any other
/// librdkafka property an operator passes through. Certificate and host name verification are always on: the
/// properties that would turn them off are refused.
public struct KafkaSecurity: Sendable, Hashable {
    public enum SecurityProtocol: String, Sendable, Hashable, CaseIterable {
        case plaintext
        case ssl
        case saslPlaintext = "sasl_plaintext"
        case saslSSL = "sasl_ssl"

        var usesTLS: Bool { self == .ssl || self == .saslSSL }
        var usesSASL: Bool { self == .saslPlaintext || self == .saslSSL }
    }

    public enum Mechanism: String, Sendable, Hashable, CaseIterable {
        case plain = "PLAIN"
        case scramSHA256 = "SCRAM-SHA-256"
        case scramSHA512 = "SCRAM-SHA-512"
    }

    public var securityProtocol = SecurityProtocol.plaintext
    public var mechanism: Mechanism?
    public var username: String?
    /// Never logged; only its presence is.
    public var password: String?
    /// Trusted instead of the system's store (`ssl.ca.location`).
    public var caFile: String?
    /// A client certificate and its key, for brokers that ask for one (mutual TLS).
    public var certificateFile: String?
    public var keyFile: String?
    /// Other librdkafka properties (`HERALD_KAFKA_PROPERTY_*`, `HERALD_KAFKA_PROPERTIES_FILE`), applied last.
    public var extraProperties: [String: String] = [:]

    public init() {}

    /// The variables, for the executables' `--help`.
    public static let usage = """
      HERALD_KAFKA_SECURITY_PROTOCOL  plaintext | ssl | sasl_plaintext | sasl_ssl [plaintext]
      HERALD_KAFKA_SASL_MECHANISM   PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 (with sasl_*)
      HERALD_KAFKA_SASL_USERNAME    and HERALD_KAFKA_SASL_PASSWORD_FILE: a file holding the password
      HERALD_KAFKA_SSL_CA_FILE      CA bundle (PEM) trusted instead of the system's [system]
      HERALD_KAFKA_SSL_CERT_FILE    and HERALD_KAFKA_SSL_KEY_FILE: client certificate and key (mutual TLS)
      HERALD_KAFKA_PROPERTY_<NAME>  any other librdkafka property, dots as underscores (LINGER_MS)
      HERALD_KAFKA_PROPERTIES_FILE  librdkafka properties, name=value lines
    """

    /// Properties an operator cannot pass through: Herald sets them from its own variables (secrets from files,
    /// never the environment), or they would break a guarantee (verification, at-least-once, idempotence).
    static let reservedProperties: [String: String] = {
        var reserved: [String: String] = [:]
        for name in ["security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
                     "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "bootstrap.servers"] {
            reserved[name] = "set it with Herald's own HERALD_KAFKA_* variable (README, Kafka security)"
        }
        for name in ["enable.ssl.certificate.verification", "ssl.endpoint.identification.algorithm"] {
            reserved[name] = "certificate and host name verification cannot be turned off"
        }
        // A send answers once its delivery report comes, within the message timeout: without a report for each
        // record, or with no timeout, a send would wait for ever.
        for name in ["enable.auto.commit", "enable.auto.offset.store", "enable.idempotence", "acks",
                     "request.required.acks", "delivery.report.only.error", "message.timeout.ms",
                     "delivery.timeout.ms"] {
            reserved[name] = "Herald sets it for at-least-once delivery"
        }
        for (name, variable) in [("group.id", "HERALD_CONSUMER_GROUP"), ("group.instance.id", "HERALD_CONSUMER_INSTANCE_ID"),
                                 ("session.timeout.ms", "HERALD_KAFKA_SESSION_TIMEOUT_SECONDS"),
                                 ("heartbeat.interval.ms", "HERALD_KAFKA_SESSION_TIMEOUT_SECONDS (a tenth of it)")] {
            reserved[name] = "set it with \(variable)"
        }
        reserved["ssl.key.password"] = "use an unencrypted key file from a Secret"
        return reserved
    }()

    /// From `HERALD_KAFKA_SECURITY_PROTOCOL`, `HERALD_KAFKA_SASL_*`, `HERALD_KAFKA_SSL_*`,
    /// `HERALD_KAFKA_PROPERTIES_FILE` and `HERALD_KAFKA_PROPERTY_<name with dots as underscores>`.
    public init(environment env: EnvironmentReader) throws(ConfigurationError) {
        let protocolText = env.string("HERALD_KAFKA_SECURITY_PROTOCOL", default: "plaintext").lowercased()
        guard let chosen = SecurityProtocol(rawValue: protocolText) else {
            throw ConfigurationError("HERALD_KAFKA_SECURITY_PROTOCOL", "expected one of "
                                     + SecurityProtocol.allCases.map(\.rawValue).joined(separator: ", ") + ", got \"\(protocolText)\"")
        }
        securityProtocol = chosen

        if let text = env.optionalString("HERALD_KAFKA_SASL_MECHANISM") {
            guard let parsed = Mechanism(rawValue: text.uppercased()) else {
                throw ConfigurationError("HERALD_KAFKA_SASL_MECHANISM", "expected one of "
                                         + Mechanism.allCases.map(\.rawValue).joined(separator: ", ") + ", got \"\(text)\"")
            }
            mechanism = parsed
        }
        username = env.optionalString("HERALD_KAFKA_SASL_USERNAME")
        password = try env.secretFile("HERALD_KAFKA_SASL_PASSWORD_FILE")
        if chosen.usesSASL {
            guard mechanism != nil else {
                throw ConfigurationError("HERALD_KAFKA_SASL_MECHANISM", "required with \(chosen.rawValue): PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
            }
            guard username != nil else { throw ConfigurationError("HERALD_KAFKA_SASL_USERNAME", "required with \(chosen.rawValue)") }
            guard password != nil else { throw ConfigurationError("HERALD_KAFKA_SASL_PASSWORD_FILE", "required with \(chosen.rawValue)") }
        } else if let set = [("HERALD_KAFKA_SASL_MECHANISM", mechanism != nil), ("HERALD_KAFKA_SASL_USERNAME", username != nil),
                             ("HERALD_KAFKA_SASL_PASSWORD_FILE", password != nil)].first(where: \.1) {
            throw ConfigurationError(set.0, "SASL settings need HERALD_KAFKA_SECURITY_PROTOCOL=sasl_ssl or sasl_plaintext (it is \(chosen.rawValue))")
        }

        caFile = try Self.readableFile(env, "HERALD_KAFKA_SSL_CA_FILE")
        certificateFile = try Self.readableFile(env, "HERALD_KAFKA_SSL_CERT_FILE")
        keyFile = try Self.readableFile(env, "HERALD_KAFKA_SSL_KEY_FILE")
        guard (certificateFile == nil) == (keyFile == nil) else {
            throw ConfigurationError("HERALD_KAFKA_SSL_CERT_FILE", "set both HERALD_KAFKA_SSL_CERT_FILE and HERALD_KAFKA_SSL_KEY_FILE, or neither")
        }
        if !chosen.usesTLS, caFile != nil || certificateFile != nil {
            // TLS files with a clear-text protocol would be ignored, and everything sent in clear.
            throw ConfigurationError(caFile != nil ? "HERALD_KAFKA_SSL_CA_FILE" : "HERALD_KAFKA_SSL_CERT_FILE",
                                     "TLS files need HERALD_KAFKA_SECURITY_PROTOCOL=ssl or sasl_ssl (it is \(chosen.rawValue))")
        }

        if let path = env.optionalString("HERALD_KAFKA_PROPERTIES_FILE") {
            guard let data = FileManager.default.contents(atPath: path) else {
                throw ConfigurationError("HERALD_KAFKA_PROPERTIES_FILE", "cannot read \(path)")
            }
            for (number, line) in String(decoding: data, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                let text = line.trimmingCharacters(in: .whitespaces)
                if text.isEmpty || text.hasPrefix("#") || text.hasPrefix("!") { continue }
                guard let equals = text.firstIndex(of: "=") else {
                    throw ConfigurationError("HERALD_KAFKA_PROPERTIES_FILE", "\(path) line \(number + 1): expected name=value")
                }
                let name = text[..<equals].trimmingCharacters(in: .whitespaces)
                try add(name, text[text.index(after: equals)...].trimmingCharacters(in: .whitespaces),
                        from: "HERALD_KAFKA_PROPERTIES_FILE (\(path) line \(number + 1))")
            }
        }
        let prefix = "HERALD_KAFKA_PROPERTY_"
        for (variable, value) in env.values.sorted(by: { $0.key < $1.key }) where variable.hasPrefix(prefix) {
            let name = variable.dropFirst(prefix.count).lowercased().replacingOccurrences(of: "_", with: ".")
            try add(name, value, from: variable)
        }
    }

    private mutating func add(_ name: String, _ value: String, from source: String) throws(ConfigurationError) {
        guard !name.isEmpty else { throw ConfigurationError(source, "a property needs a name") }
        if let reason = Self.reservedProperties[name] { throw ConfigurationError(source, "\(name) cannot be passed through: \(reason)") }
        if let reason = RDKafkaConfigurationCheck.rejection(of: name, value: value) {
            throw ConfigurationError(source, "librdkafka refuses \(name): \(reason)")
        }
        extraProperties[name] = value
    }

    private static func readableFile(_ env: EnvironmentReader, _ name: String) throws(ConfigurationError) -> String? {
        guard let path = env.optionalString(name) else { return nil }
        guard FileManager.default.isReadableFile(atPath: path) else { throw ConfigurationError(name, "cannot read \(path)") }
        return path
    }

    /// The librdkafka properties of the protocol, SASL and TLS settings (the pass-through ones not included).
    var properties: [String: String] {
        var out = ["security.protocol": securityProtocol.rawValue]
        if securityProtocol.usesSASL, let mechanism, let username, let password {
            out["sasl.mechanism"] = mechanism.rawValue
            out["sasl.username"] = username
            out["sasl.password"] = password
        }
        if securityProtocol.usesTLS {
            out["enable.ssl.certificate.verification"] = "true"
            out["ssl.endpoint.identification.algorithm"] = "https"
            if let caFile { out["ssl.ca.location"] = caFile }
            if let certificateFile, let keyFile {
                out["ssl.certificate.location"] = certificateFile
                out["ssl.key.location"] = keyFile
            }
        }
        return out
    }

    /// What the start-up log line says: the protocol, and the mechanism and user when SASL is on. No secret.
    public var logFields: [String: String] {
        var fields = ["kafka.security.protocol": securityProtocol.rawValue]
        if securityProtocol.usesSASL {
            fields["kafka.sasl.mechanism"] = mechanism?.rawValue ?? ""
            fields["kafka.sasl.username"] = username ?? ""
        }
        if certificateFile != nil { fields["kafka.ssl.client_certificate"] = "yes" }
        if !extraProperties.isEmpty { fields["kafka.extra_properties"] = extraProperties.keys.sorted().joined(separator: ",") }
        return fields
    }
}

extension KafkaSecurity: CustomStringConvertible, CustomReflectable {
    /// The settings with the password left out, so that printing a configuration cannot leak it.
    public var description: String {
        let sasl = securityProtocol.usesSASL ? " \(mechanism?.rawValue ?? "?") user \(username ?? "?")" : ""
        return "KafkaSecurity(\(securityProtocol.rawValue)\(sasl), ca: \(caFile ?? "system"), client certificate: "
            + "\(certificateFile ?? "none"), extra: \(extraProperties.keys.sorted()))"
    }

    public var customMirror: Mirror { Mirror(self, children: ["description": description]) }
}
