import Foundation
import HeraldCrypto
import HeraldKafka
import HeraldRuntime
import HeraldTestSupport
import Testing

/// The whole path over the connections a platform runs: Redis that speaks only TLS, asks for client certificates
/// and knows Herald as an ACL user limited to `herald:*`; Kafka behind a TLS proxy that asks for client
/// certificates (Tansu 0.6 cannot serve TLS itself). Then each wrong setting: the service stays unready and its
/// log says why, with no secret in any line.
@Suite("Secure connections to Redis and Kafka", .serialized)
struct SecureConnectionsTests {
    /// The pieces every test here starts: PKI, TLS Redis, TLS Kafka and its topics.
    struct Secured {
        let directory: String
        let pki: TestPKI
        let redis: TLSRedisServer
        let kafka: TLSKafkaBroker
        let topics: FaultTopics

        static func start(_ prefix: String) async throws -> Secured {
            let directory = try scratchDirectory(prefix)
            let pki = try TestPKI(directory: directory + "/pki")
            let redis = try TLSRedisServer(pki: pki, directory: directory, clientCertificates: true)
            let kafka = try await TLSKafkaBroker(pki: pki, directory: directory, clientCertificates: true)
            try await redis.waitUntilReady()
            let topics = FaultTopics(brokers: kafka.address)
            try await topics.create(partitions: 2, security: try KafkaSecurity(environment: EnvironmentReader(kafka.environment)))
            return Secured(directory: directory, pki: pki, redis: redis, kafka: kafka, topics: topics)
        }

        /// What herald-ingest, herald-dispatcher and heraldctl are given.
        var environment: [String: String] { redis.environment.merging(kafka.environment) { _, new in new } }

        func stop() async {
            await kafka.stop()
            await redis.stop()
        }
    }

    @Test("subscribe, register, fan-out, dead-letter and replay, all through TLS Redis and mutual-TLS Kafka")
    func everyPathRunsOverSecureConnections() async throws {
        let secured = try await Secured.start("herald-secure-")
        let apps = try TestApps()
        defer { apps.remove() }
        let app = apps.apps[0]
        let simulator = try SimulatorProcess(apps: apps, directory: secured.directory, rules: [
            .object(["tokenPrefix": .string("badd"), "status": .number(400), "reason": .string("BadTopic")]),
        ])
        let ingest = try IngestServer(apps: apps, redisURL: secured.redis.url, topics: secured.topics,
                                      directory: secured.directory, name: "ingest", extra: secured.environment)
        try await simulator.waitUntilListening()
        let dispatcher = try DispatcherProcess(apps: apps, simulator: simulator, topics: secured.topics,
                                               redisURL: secured.redis.url, directory: secured.directory,
                                               name: "dispatcher", extra: secured.environment)
        try await ingest.waitUntilReady()
        try await dispatcher.waitForAssignment()
        #expect(ingest.child.log.contains(#""kafka.security.protocol":"ssl""#), "the start-up line names the protocol")

        let channel = "order:\(SecureRandom.hex(4)):status"
        let good = (0..<3).map { _ in SecureRandom.hex(32) }
        let rejected = "badd" + SecureRandom.hex(32).dropFirst(4)
        for token in good + [rejected] {
            let created = try await ingest.request("POST", "/v1/apps/\(app.id)/subscriptions", key: app.publicKey,
                                                   json: #"{"channel": "\#(channel)", "deviceToken": "\#(token)", "tokenType": "alert"}"#)
            #expect(created.status == 201, "subscribe: \(created.text)")
        }
        // 16 hex digits: scan-logs takes any run of 32 or more in a log line for a push token.
        let post = SecureRandom.hex(8), activityToken = SecureRandom.hex(32)
        let registered = try await ingest.request("POST", "/v1/apps/\(app.id)/activities/register", key: app.publicKey,
                                                  json: #"{"push_token": "\#(activityToken)", "post_id_hash": "\#(post)", "bundle_id": "\#(app.bundleID)"}"#)
        #expect(registered.status == 201 || registered.status == 200, "register: \(registered.text)")

        let event = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey,
                                             json: #"{"channel": "\#(channel)", "alert": {"aps": {"alert": "shipped"}}}"#)
        #expect(event.status == 202, "event: \(event.text)")
        let update = try await ingest.request("POST", "/v1/apps/\(app.id)/activities/\(post)/events", key: app.secretKey,
                                              json: #"{"event": "update", "contentState": {"n": 1}}"#)
        #expect(update.status == 202, "activity event: \(update.text)")
        try await eventually("the fan-out and the activity update were delivered", timeout: .seconds(30)) {
            simulator.acceptedCount() >= 4
        }
        let delivered = Set(simulator.accepted().compactMap { $0["token"]?.stringValue })
        #expect(delivered == Set(good + [activityToken]))
        try await eventually("the rejected push was dead-lettered", timeout: .seconds(30)) {
            await dispatcher.metric("herald_dispatcher_dead_letters_total") ?? 0 >= 1
        }

        // heraldctl replays it through the same secured connections once APNs accepts the token.
        try simulator.setRules([])
        try await Task.sleep(for: .milliseconds(300))
        let replay = try await heraldctl(["replay", "--name", "secure-" + SecureRandom.hex(3), "--json"],
                                         environment: secured.environment.merging([
                                             "HERALD_TOPIC_JOBS": secured.topics.jobs, "HERALD_TOPIC_DLQ": secured.topics.deadLetters,
                                             "HERALD_JOB_SIGNING_SECRET_FILE": apps.jobSigningSecretPath,
                                         ]) { _, new in new }, directory: secured.directory)
        #expect(replay.status == 0 && replay.output.contains(#""republished":1"#), "replay: \(replay.output)")
        try await eventually("the replayed push was delivered", timeout: .seconds(30)) {
            simulator.accepted().contains { $0["token"]?.stringValue == rejected }
        }

        await dispatcher.child.stop()
        await ingest.child.stop()
        await simulator.child.stop()
        for log in [ingest.child.log, dispatcher.child.log, replay.output] {
            #expect(!log.contains(secured.redis.password), "no secret in any log line")
        }
        await secured.stop()
    }

    @Test("a wrong CA, a missing or untrusted client certificate, SASL the broker does not speak: unready, one reason")
    func wrongSettingsKeepTheServiceUnreadyAndSayWhy() async throws {
        let secured = try await Secured.start("herald-secure-bad-")
        let apps = try TestApps()
        defer { apps.remove() }
        let passwordFile = secured.directory + "/sasl-password"
        let saslPassword = "sasl-" + SecureRandom.hex(8)
        try saslPassword.write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let pki = secured.pki
        let cases: [(String, [String: String], String)] = [
            ("Kafka: a CA that did not sign the broker's certificate", ["HERALD_KAFKA_SSL_CA_FILE": pki.otherCA],
             "certificate verify failed"),
            ("Kafka: no client certificate", ["HERALD_KAFKA_SSL_CERT_FILE": "", "HERALD_KAFKA_SSL_KEY_FILE": ""], "SSL"),
            ("Kafka: a client certificate the proxy does not trust",
             ["HERALD_KAFKA_SSL_CERT_FILE": pki.otherClientCertificate, "HERALD_KAFKA_SSL_KEY_FILE": pki.otherClientKey], "SSL"),
            // The broker behind the proxy has no SASL: librdkafka's SASL handshake is what fails.
            ("Kafka: SASL against a broker without it",
             ["HERALD_KAFKA_SECURITY_PROTOCOL": "sasl_ssl", "HERALD_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
              "HERALD_KAFKA_SASL_USERNAME": "herald", "HERALD_KAFKA_SASL_PASSWORD_FILE": passwordFile], "SASL"),
            ("Redis: a CA that did not sign the server's certificate", ["HERALD_REDIS_CA_FILE": pki.otherCA],
             "certificate verify failed"),
            ("Redis: a client certificate the server does not trust",
             ["HERALD_REDIS_CERT_FILE": pki.otherClientCertificate, "HERALD_REDIS_KEY_FILE": pki.otherClientKey], "TLS"),
            ("Redis: the wrong password", ["HERALD_REDIS_URL": "rediss://herald:wrong-\(saslPassword)@127.0.0.1:\(secured.redis.port)/0"],
             "WRONGPASS"),
        ]
        for (index, (what, change, reason)) in cases.enumerated() {
            let environment = secured.environment.merging(change) { _, new in new }
            let ingest = try IngestServer(apps: apps, redisURL: secured.redis.url, topics: secured.topics,
                                          directory: secured.directory, name: "ingest-bad-\(index)", extra: environment)
            try await eventually("\(what): the ingest answers /readyz", timeout: .seconds(20)) {
                await ingest.readyStatus() != 0
            }
            // Give it the time a good configuration needs to get ready (well under a second here), and more.
            try await Task.sleep(for: .seconds(2))
            #expect(await ingest.readyStatus() == 503, "\(what): not ready")
            #expect(ingest.child.isRunning, "\(what): no crash, no hang on start")
            let log = ingest.child.log
            let lines = log.split(separator: "\n").filter { $0.contains(reason) }
            #expect(!lines.isEmpty, "\(what): the log says why (\(reason)):\n\(log.suffix(2000))")
            // Reconnects go on every 100 ms or so; their errors are logged once, not each time.
            #expect(log.split(separator: "\n").count < 30, "\(what): the log is flooded:\n\(log.suffix(2000))")
            for secret in [saslPassword, secured.redis.password] { #expect(!log.contains(secret), "\(what): a secret in the log") }
            await ingest.child.stop()
        }
        await secured.stop()
    }
}

/// heraldctl as a process with `environment`; its exit status and everything it printed.
func heraldctl(_ arguments: [String], environment: [String: String], directory: String) async throws
    -> (status: Int32, output: String) {
    let child = try ChildProcess("heraldctl", executable: try builtExecutable("heraldctl"), arguments: arguments,
                                 environment: environment, logPath: directory + "/heraldctl-\(SecureRandom.hex(3)).log")
    let status = await child.waitForExit(timeout: .seconds(60))
    if status == nil { await child.crash() }
    return (status ?? -1, child.log)
}
