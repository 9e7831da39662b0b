import Foundation
import HeraldCrypto
import HeraldRuntime

/// The test PKI `scripts/tls-certificates` writes: a CA, a server certificate for 127.0.0.1 and localhost, a
/// client certificate the CA signed, and a second CA with a client certificate nobody trusts.
public struct TestPKI: Sendable {
    public let directory: String

    public init(directory: String) throws {
        self.directory = directory
        let script = TestEnvironment.repositoryRoot.appendingPathComponent("scripts/tls-certificates").path
        _ = try runTool("/bin/bash", [script, directory])
    }

    public var ca: String { directory + "/ca.pem" }
    public var serverCertificate: String { directory + "/server.pem" }
    public var serverKey: String { directory + "/server-key.pem" }
    public var clientCertificate: String { directory + "/client.pem" }
    public var clientKey: String { directory + "/client-key.pem" }
    public var otherCA: String { directory + "/other-ca.pem" }
    public var otherClientCertificate: String { directory + "/other-client.pem" }
    public var otherClientKey: String { directory + "/other-client-key.pem" }
}

/// The ACL rules of Herald's Redis user, from `examples/redis-acl-rules.txt` (what README tells operators to use).
public var heraldRedisACL: [String] {
    let path = TestEnvironment.repositoryRoot.appendingPathComponent("examples/redis-acl-rules.txt").path
    let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
    return text.split(separator: "\n").filter { !$0.hasPrefix("#") }.flatMap { $0.split(separator: " ") }.map(String.init)
}

/// A redis-server of the test's own that speaks only TLS (`--port 0 --tls-port`), optionally asking for client
/// certificates, with an ACL user `herald` limited to `heraldRedisACL` and the default user switched off.
public final class TLSRedisServer: Sendable {
    public let port: UInt16
    public let pki: TestPKI
    public let password = "herald-" + SecureRandom.hex(8)
    /// The administrator, for the test's own checks.
    public let adminPassword = "admin-" + SecureRandom.hex(8)
    private let directory: String
    private let process = Lock<ChildProcess?>(nil)

    public init(pki: TestPKI, directory: String, clientCertificates: Bool) throws {
        port = try freePort()
        self.pki = pki
        self.directory = directory + "/redis-tls"
        try FileManager.default.createDirectory(atPath: self.directory, withIntermediateDirectories: true)
        let child = try ChildProcess("redis-server", executable: "/usr/bin/redis-server", arguments: [
            "--bind", "127.0.0.1", "--port", "0", "--tls-port", "\(port)", "--tls-cert-file", pki.serverCertificate,
            "--tls-key-file", pki.serverKey, "--tls-ca-cert-file", pki.ca,
            "--tls-auth-clients", clientCertificates ? "yes" : "no",
            "--dir", self.directory, "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--user", "default", "off", "--user", "admin", "on", ">\(adminPassword)", "~*", "&*", "+@all",
            "--user", "herald", "on", ">\(password)",
        ] + heraldRedisACL, environment: [:], logPath: self.directory + "/redis.log")
        process.withLock { $0 = child }
    }

    /// The URL Herald is given (`HERALD_REDIS_URL`), as the limited user.
    public var url: String { "rediss://herald:\(password)@127.0.0.1:\(port)/0" }

    /// The environment for herald-ingest, herald-dispatcher and heraldctl, client certificate included.
    public var environment: [String: String] {
        ["HERALD_REDIS_URL": url, "HERALD_REDIS_CA_FILE": pki.ca,
         "HERALD_REDIS_CERT_FILE": pki.clientCertificate, "HERALD_REDIS_KEY_FILE": pki.clientKey]
    }

    /// redis-cli over TLS as the administrator.
    public func cli(_ command: [String]) throws -> String {
        try runTool("redis-cli", ["--tls", "--cacert", pki.ca, "--cert", pki.clientCertificate, "--key", pki.clientKey,
                                  "-p", "\(port)", "--user", "admin", "--pass", adminPassword, "--no-auth-warning"] + command)
    }

    public func waitUntilReady() async throws {
        try await eventually("the TLS redis-server answers on \(port)", timeout: .seconds(10)) {
            (try? self.cli(["PING"]))?.contains("PONG") == true
        }
    }

    public func stop() async {
        guard let child = process.withLock({ p -> ChildProcess? in defer { p = nil }; return p }) else { return }
        await child.crash()
    }
}

/// A TLS-terminating proxy (socat) in front of a broker of the test's own: Tansu 0.6 cannot serve TLS itself, so
/// it advertises the proxy's address and every client connection goes through TLS. With `clientCertificates` the
/// proxy refuses a client without a certificate its CA signed (mutual TLS).
public final class TLSKafkaBroker: Sendable {
    public let broker: TansuBroker
    public let port: UInt16
    public let pki: TestPKI
    private let process = Lock<ChildProcess?>(nil)

    public init(pki: TestPKI, directory: String, clientCertificates: Bool) async throws {
        port = try freePort()
        self.pki = pki
        broker = try TansuBroker(logPath: directory + "/tansu-tls.log", advertisedPort: port)
        try await broker.start()
        let listen = "OPENSSL-LISTEN:\(port),bind=127.0.0.1,reuseaddr,fork,cert=\(pki.serverCertificate),"
            + "key=\(pki.serverKey),cafile=\(pki.ca),verify=\(clientCertificates ? 1 : 0)"
        let child = try ChildProcess("socat", executable: "/usr/bin/socat",
                                     arguments: ["-d", listen, "TCP:127.0.0.1:\(broker.port)"],
                                     environment: [:], logPath: directory + "/socat.log")
        process.withLock { $0 = child }
        let port = port
        try await eventually("the TLS proxy listens on \(port)") {
            (try? await onThread { _ = try RawHTTPClient(port: port, timeout: 1) }) != nil
        }
    }

    /// `HERALD_KAFKA_BROKERS`.
    public var address: String { "127.0.0.1:\(port)" }

    /// The environment of a client that trusts the CA and presents the client certificate.
    public var environment: [String: String] {
        ["HERALD_KAFKA_BROKERS": address, "HERALD_KAFKA_SECURITY_PROTOCOL": "ssl", "HERALD_KAFKA_SSL_CA_FILE": pki.ca,
         "HERALD_KAFKA_SSL_CERT_FILE": pki.clientCertificate, "HERALD_KAFKA_SSL_KEY_FILE": pki.clientKey]
    }

    public func stop() async {
        if let child = process.withLock({ p -> ChildProcess? in defer { p = nil }; return p }) { await child.crash() }
        await broker.crash()
    }
}
