import Foundation
import HeraldCrypto
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldTestSupport
import Testing

/// Who may call what (design.md, "Auth"), that API keys exist only as hashes, that APNs TLS verification has no
/// off switch, and that push tokens stay out of logs.
@Suite(.serialized) struct SecurityTests {
    /// One ingest endpoint of app `target`, with a body it accepts from a rightful caller.
    struct Endpoint {
        var method: String
        var path: String
        var body: String?
        /// Producer endpoints take a secret key only.
        var producer: Bool
        /// Accepts OAuth 2 bearer tokens (the activities registrations).
        var oauth: Bool
        /// The app comes from the key (`/api/v1/activities/register`): another app's key acts as that app.
        var appFromKey: Bool = false
    }

    static func endpoints(for app: TestApps.Entry, token: String, post: String) -> [Endpoint] {
        let subscription = #"{"channel": "orders", "tokenType": "alert", "deviceToken": "\#(token)"}"#
        let registration = #"{"push_token": "\#(token)", "post_id_hash": "\#(post)", "bundle_id": "\#(app.bundleID)"}"#
        return [
            Endpoint(method: "POST", path: "/v1/apps/\(app.id)/subscriptions", body: subscription, producer: false, oauth: false),
            Endpoint(method: "GET", path: "/v1/apps/\(app.id)/subscriptions?deviceToken=\(token)", producer: false, oauth: false),
            Endpoint(method: "DELETE", path: "/v1/apps/\(app.id)/subscriptions", body: #"{"deviceToken": "\#(token)"}"#,
                     producer: false, oauth: false),
            Endpoint(method: "POST", path: "/v1/apps/\(app.id)/activities/register", body: registration, producer: false,
                     oauth: true),
            Endpoint(method: "POST", path: "/api/v1/activities/register", body: registration, producer: false, oauth: true,
                     appFromKey: true),
            Endpoint(method: "POST", path: "/v1/apps/\(app.id)/events",
                     body: #"{"channel": "orders", "alert": {"aps": {"alert": "x"}}}"#, producer: true, oauth: false),
            Endpoint(method: "POST", path: "/v1/apps/\(app.id)/activities/\(post)/events",
                     body: #"{"event": "update", "contentState": {"n": 1}}"#, producer: true, oauth: false),
            Endpoint(method: "POST", path: "/v1/apps/\(app.id)/devices/\(token)/push",
                     body: #"{"payload": {"aps": {"alert": "x"}}}"#, producer: true, oauth: false),
        ]
    }

    /// Every endpoint of app A with no key, an unknown key, each key of apps B and C (in both headers), B's OAuth
    /// token, and A's own keys where they are the wrong kind: each refused exactly as design.md says, and Redis
    /// unchanged for all three apps. A's own right keys, last, succeed (so the endpoints really work).
    @Test func everyEndpointRefusesEveryoneButItsOwnApp() async throws {
        let apps = try TestApps(count: 3)
        let ingest = try await ReliabilityIngest(apps: apps)
        let redis = RedisClient(configuration: try RedisConfiguration(url: try TestEnvironment.redisURL()))
        let (a, b, c) = (apps.apps[0], apps.apps[1], apps.apps[2])
        let token = SecureRandom.hex(32), post = String(SHA256.hex(SecureRandom.hex(8)).prefix(16))
        let endpoints = Self.endpoints(for: a, token: token, post: post)

        // Give A (and B, C) data to protect: a subscription and a registration each.
        for app in apps.apps {
            let own = Self.endpoints(for: app, token: token, post: post)
            for endpoint in [own[0], own[3]] {
                let response = try await ingest.request(endpoint.method, endpoint.path, headers: ["X-API-Key": app.secretKey],
                                                        json: endpoint.body)
                try #require((200...201).contains(response.status), "seeding \(endpoint.path): \(response.text)")
            }
        }
        func snapshot() async throws -> [String: [UInt8]] {
            var all: [String: [UInt8]] = [:]
            for app in apps.apps {
                // The caller-as-itself endpoint counts B's and C's requests in their rate-limit keys; nothing else.
                for (key, value) in try await redisSnapshot(redis, pattern: "herald:{\(app.id)[:}]*")
                where app.id == a.id || !key.contains(":rl:") {
                    all[key] = value
                }
            }
            return all
        }
        let before = try await snapshot()
        #expect(before.keys.contains { $0.hasPrefix("herald:{\(a.id):d:") && $0.contains("}:sub:") })

        typealias Credential = (name: String, headers: [String: String])
        func both(_ name: String, _ key: String) -> [Credential] {
            [(name + " in X-API-Key", ["X-API-Key": key]), (name + " as Bearer", ["Authorization": "Bearer \(key)"])]
        }
        let unknown = "hrd_sec_" + SecureRandom.hex(16)
        let others: [Credential] = both("B public", b.publicKey) + both("B secret", b.secretKey) + both("B user", b.userKey)
            + both("C public", c.publicKey) + both("C secret", c.secretKey)
        let bToken = try apps.accessToken(for: b)
        let aTokenWithoutScope = try apps.accessToken(for: a, scope: "profile")

        var tried = 0
        var wrong: [String] = []
        func check(_ endpoint: Endpoint, _ credential: Credential, status expected: Int, code: String? = nil) async throws {
            let response = try await ingest.request(endpoint.method, endpoint.path, headers: credential.headers,
                                                    json: endpoint.body)
            tried += 1
            let gotCode = (try? response.json())?["error"].flatMap { ($0 as? [String: Any])?["code"] as? String }
            if response.status != expected || (code != nil && gotCode != code) {
                wrong.append("\(endpoint.method) \(endpoint.path) with \(credential.name): \(response.status) \(response.text), expected \(expected) \(code ?? "")")
            }
            for key in apps.apps.flatMap({ [$0.publicKey, $0.secretKey, $0.userKey] }) + [unknown]
            where response.text.contains(key) {
                wrong.append("\(endpoint.path) echoed a key")
            }
        }
        for endpoint in endpoints {
            try await check(endpoint, ("no key", [:]), status: 401, code: "unauthorized")
            for credential in both("unknown key", unknown) { try await check(endpoint, credential, status: 401, code: "unauthorized") }
            for credential in others {
                // Another app's key on the app-from-key endpoint is that app acting as itself: A's bundle id is not
                // its own, so 400, and A's data untouched.
                try await check(endpoint, credential, status: endpoint.appFromKey ? (endpoint.producer ? 403 : 400) : 403,
                                code: endpoint.appFromKey ? nil : "forbidden")
            }
            if endpoint.producer {
                for credential in both("A public", a.publicKey) + both("A user", a.userKey) {
                    try await check(endpoint, credential, status: 403, code: "forbidden")
                }
            }
            if endpoint.oauth {
                try await check(endpoint, ("B's OAuth token", ["Authorization": "Bearer \(bToken)"]),
                                status: endpoint.appFromKey ? 400 : 403)
                try await check(endpoint, ("A's OAuth token without the scope", ["Authorization": "Bearer \(aTokenWithoutScope)"]),
                                status: 403, code: "insufficient_scope")
            } else {
                // Where OAuth is not taken, a JWT is just an unknown API key.
                try await check(endpoint, ("B's OAuth token", ["Authorization": "Bearer \(bToken)"]), status: 401)
            }
        }
        let after = try await snapshot()
        print("[security] key matrix: \(endpoints.count) endpoints, \(tried) requests refused as designed: \(wrong.isEmpty)")
        #expect(wrong.isEmpty, "\(wrong.count) wrong answers:\n\(wrong.prefix(10).joined(separator: "\n"))")
        #expect(after == before, "Redis changed: \(Set(after.keys).symmetricDifference(before.keys).sorted().prefix(10)), or values of \(before.keys.filter { after[$0] != before[$0] }.sorted().prefix(10))")

        // The rightful callers get through (the refusals above were about the key, not a broken endpoint).
        for endpoint in endpoints {
            let key = endpoint.producer ? a.secretKey : a.publicKey
            let response = try await ingest.request(endpoint.method, endpoint.path, headers: ["X-API-Key": key], json: endpoint.body)
            #expect((200...202).contains(response.status), "\(endpoint.method) \(endpoint.path): \(response.text)")
        }
        let bearer = try apps.accessToken(for: a)
        let oauth = try await ingest.request("POST", endpoints[3].path, headers: ["Authorization": "Bearer \(bearer)"],
                                             json: endpoints[3].body)
        #expect(oauth.status == 201, "\(oauth.text)")

        try await Self.expectNoRawKeys(apps: apps, redis: redis, logs: [ingest.child.log])
        await redis.close()
        await ingest.stop(keepFiles: !wrong.isEmpty)
    }

    /// No API key in any Redis key name or value (the whole database, every type), in the logs, or in the apps file:
    /// only their SHA-256.
    static func expectNoRawKeys(apps: TestApps, redis: RedisClient, logs: [String]) async throws {
        let secrets = apps.apps.flatMap { [$0.publicKey, $0.secretKey, $0.userKey] }
        #expect(secrets.allSatisfy { $0.hasPrefix("hrd_") })
        var scanned = 0
        var cursor = "0"
        repeat {
            let reply = try await redis.command(["SCAN", cursor, "COUNT", "1000"])
            guard case .array(let parts) = reply, parts.count == 2, let next = parts[0].string,
                  case .array(let keys) = parts[1] else { throw TestSocket.Failure(description: "bad SCAN reply") }
            cursor = next
            // One pipeline of TYPEs and one of reads per page: the database may hold tens of thousands of keys.
            let names = keys.compactMap(\.string)
            scanned += names.count
            let types = try await redis.pipeline(names.map { ["TYPE", $0] })
            let reads: [[String]] = zip(names, types).map { key, type in
                switch type.string ?? "" {
                case "string": ["GET", key]
                case "hash": ["HGETALL", key]
                case "set": ["SMEMBERS", key]
                case "zset": ["ZRANGE", key, "0", "-1"]
                case "list": ["LRANGE", key, "0", "-1"]
                default: ["TYPE", key]
                }
            }
            for (key, value) in zip(names, try await redis.pipeline(reads)) {
                var bytes = Array(key.utf8)
                Self.flatten(value, into: &bytes)
                // Every key starts `hrd_`: one search rules out most values.
                guard Self.contains(bytes, "hrd_") else { continue }
                for secret in secrets where Self.contains(bytes, secret) {
                    Issue.record("Redis key \(key) holds a raw API key")
                }
            }
        } while cursor != "0"
        #expect(scanned > 0)
        for log in logs {
            #expect(!log.isEmpty)
            for secret in secrets where log.contains(secret) { Issue.record("a raw API key is logged") }
        }
        let file = try String(contentsOfFile: apps.path, encoding: .utf8)
        for (entry, secret) in zip(apps.apps.flatMap { [$0, $0, $0] }, secrets) {
            #expect(!file.contains(secret), "the apps file of \(entry.id) holds a raw key")
            #expect(file.contains(SHA256.hex(secret)))
        }
        print("[security] \(scanned) Redis keys and \(logs.count) logs scanned for \(secrets.count) raw API keys")
    }

    /// Every byte of a reply, nested arrays included, space-separated.
    static func flatten(_ value: RedisValue, into bytes: inout [UInt8]) {
        switch value {
        case .array(let items): for item in items { flatten(item, into: &bytes) }
        default: bytes.append(0x20); bytes.append(contentsOf: value.bytes ?? [])
        }
    }

    /// A plain byte search (String.contains is slow on the fan-out tests' sets of tens of thousands of members).
    static func contains(_ haystack: [UInt8], _ needle: String) -> Bool {
        let pattern = Array(needle.utf8)
        guard let first = pattern.first, haystack.count >= pattern.count else { return false }
        var index = 0
        while index <= haystack.count - pattern.count {
            if haystack[index] == first, haystack[index..<index + pattern.count].elementsEqual(pattern) { return true }
            index += 1
        }
        return false
    }

    /// herald-ingest holds OAuth verification keys and its Redis and Kafka credentials: core dumps are off.
    @Test func ingestWritesNoCoreDump() async throws {
        let ingest = try await ReliabilityIngest()
        #expect(coreFileLimit(pid: ingest.child.pid).map { [$0.soft, $0.hard] } == ["0", "0"])
        await ingest.stop()
    }

    /// herald-ingest signs nothing, so it never opens an APNs key: it starts and serves with every `.p8` gone,
    /// where the dispatcher refuses to start.
    @Test func ingestStartsWithoutTheAPNsKeys() async throws {
        let apps = try TestApps()
        defer { apps.remove() }
        for app in apps.apps { try FileManager.default.removeItem(at: apps.folder.appendingPathComponent("\(app.id).p8")) }
        let ingest = try await ReliabilityIngest(apps: apps)
        let app = apps.apps[0]
        let created = try await ingest.request("POST", "/v1/apps/\(app.id)/subscriptions", headers: ["X-API-Key": app.publicKey],
                                               json: #"{"channel": "news", "deviceToken": "\#(SecureRandom.hex(32))", "tokenType": "alert"}"#)
        #expect(created.status == 201, "\(created.text)")
        let directory = try scratchDirectory("herald-no-keys-")
        let dispatcher = try ChildProcess("herald-dispatcher", executable: try builtExecutable("herald-dispatcher"),
                                          environment: apps.environment.merging(["HERALD_DISPATCHER_ADDR": "127.0.0.1:0"]) { _, new in new },
                                          logPath: directory + "/dispatcher.log")
        #expect(await dispatcher.waitForExit(timeout: .seconds(10)) == 2)
        #expect(dispatcher.log.contains("privateKeyPath"), "\(dispatcher.log)")
        await ingest.stop()
    }

    /// Without the deployment's job-signing secret both services refuse to start (exit 2, one line naming the
    /// variable); `HERALD_JOB_SIGNATURES=unverified` starts them with a warning.
    @Test func servicesRefuseToStartWithoutASigningSecret() async throws {
        let apps = try TestApps()
        defer { apps.remove() }
        let directory = try scratchDirectory("herald-unsigned-")
        for name in ["herald-ingest", "herald-dispatcher"] {
            let environment = ["HERALD_APPS_FILE": apps.path, "HERALD_INGEST_ADDR": "127.0.0.1:0",
                               "HERALD_DISPATCHER_ADDR": "127.0.0.1:0"]
            let refused = try ChildProcess(name, executable: try builtExecutable(name), environment: environment,
                                           logPath: directory + "/\(name).log")
            #expect(await refused.waitForExit(timeout: .seconds(10)) == 2, "\(name)")
            let lines = refused.log.split(separator: "\n")
            #expect(lines.count == 1 && lines[0].contains("HERALD_JOB_SIGNING_SECRET_FILE"), "\(name): \(refused.log)")
        }
        let ingest = try await ReliabilityIngest(apps: apps, extra: ["HERALD_JOB_SIGNING_SECRET_FILE": "",
                                                                     "HERALD_JOB_SIGNATURES": "unverified"])
        #expect(ingest.child.log.contains("HERALD_JOB_SIGNATURES=unverified"), "\(ingest.child.log)")
        await ingest.stop()
    }

    /// `heraldctl keys new` prints the key once and its SHA-256 entry for the apps file, and stores nothing.
    @Test func heraldctlPrintsTheKeyOnceAndItsHash() throws {
        for kind in ["public", "secret"] {
            let output = try runTool(try builtExecutable("heraldctl"), ["keys", "new", "--app", "shop", "--kind", kind])
            let key = try #require(output.split(whereSeparator: \.isWhitespace).first { $0.hasPrefix("hrd_") }.map(String.init))
            #expect(key.hasPrefix(kind == "public" ? "hrd_pub_" : "hrd_sec_"))
            #expect(key.count >= 8 + 32, "too short to be unguessable: \(key.count)")
            #expect(output.components(separatedBy: key).count == 2, "the key is printed more than once")
            #expect(output.contains(#""sha256": "\#(SHA256.hex(key))""#), "\(output)")
            #expect(output.contains(#""kind": "\#(kind)""#))
        }
    }
}

/// APNs TLS verification has no off switch: the code only ever asks for peer verification, no variable touches it,
/// and a whole dispatcher pointed at a server whose CA it was not given delivers nothing.
@Suite(.serialized) struct SecurityAPNsTLSTests {
    static let sources = TestEnvironment.repositoryRoot.appendingPathComponent("Sources")

    static func swiftAndCSources() throws -> [(path: String, text: String)] {
        let enumerator = try #require(FileManager.default.enumerator(atPath: sources.path))
        return enumerator.compactMap { $0 as? String }
            .filter { $0.hasSuffix(".swift") || $0.hasSuffix(".c") || $0.hasSuffix(".h") }
            .compactMap { path in
                (try? String(contentsOfFile: sources.appendingPathComponent(path).path, encoding: .utf8)).map { (path, $0) }
            }
    }

    @Test func theCodeOnlyEverRequiresPeerVerification() throws {
        let files = try Self.swiftAndCSources()
        #expect(files.count > 50)
        var setVerify = 0
        for (path, text) in files {
            for banned in ["SSL_VERIFY_NONE", "set_cert_verify_callback", "X509_STORE_set_verify_cb",
                           "X509_V_FLAG_PARTIAL_CHAIN", "SSL_set_verify_result"] {
                #expect(!text.contains(banned), "\(path) uses \(banned)")
            }
            for line in text.split(separator: "\n") where line.contains("SSL_CTX_set_verify(") || line.contains("SSL_set_verify(") {
                setVerify += 1
                // Peer verification, no callback that could override the verdict.
                #expect(line.contains("SSL_VERIFY_PEER") && line.contains("nil)"), "\(path): \(line)")
            }
        }
        #expect(setVerify >= 1, "no SSL_CTX_set_verify call found: did the TLS code move?")
    }

    /// The dispatcher's APNs variables, read from its source (its main and the APNs configuration it reads the
    /// rest with): if one is added it must be added here, on purpose — and it must not be a way to switch
    /// verification off.
    @Test func noVariableSwitchesVerificationOff() throws {
        let pattern = try Regex(#""(HERALD_[A-Z_]*(APNS|TLS|SSL|CA|VERIFY|INSECURE|CERT)[A-Z_]*)""#)
        var variables = Set<String>()
        for file in ["herald-dispatcher/main.swift", "HeraldAPNs/APNsConfiguration.swift"] {
            let text = try String(contentsOf: Self.sources.appendingPathComponent(file), encoding: .utf8)
            variables.formUnion(text.matches(of: pattern).map { String($0.output[1].substring ?? "") })
        }
        #expect(variables == ["HERALD_APNS_PRODUCTION_URL", "HERALD_APNS_SANDBOX_URL", "HERALD_APNS_CA_FILE",
                              "HERALD_APNS_CONNECTIONS", "HERALD_APNS_BROADCAST_PRODUCTION_URL",
                              "HERALD_APNS_BROADCAST_SANDBOX_URL", "HERALD_APNS_MANAGE_PRODUCTION_URL",
                              "HERALD_APNS_MANAGE_SANDBOX_URL",
                              // Matched for the "CA" in "BROADCAST": the janitor's timings, nothing about TLS.
                              "HERALD_BROADCAST_IDLE_SECONDS", "HERALD_BROADCAST_JANITOR_INTERVAL_SECONDS"],
                "\(variables.sorted())")
    }

    /// herald-dispatcher without the simulator's CA (and with every plausible "insecure" variable set) refuses the
    /// simulator's certificate: every connection fails verification, the simulator accepts nothing. Then the same with
    /// `HERALD_APNS_CA_FILE`: delivered. Every process log of the run passes scripts/ci/scan-logs (the push token went
    /// through ingest, the dispatcher's retries and the simulator).
    @Test func aServerOutsideTheTrustStoreIsRefusedUnlessItsCAIsGiven() async throws {
        let apps = try TestApps(count: 1)
        let app = apps.apps[0]
        let ingest = try await ReliabilityIngest(apps: apps)
        let simulator = try SimulatorProcess(apps: apps, directory: ingest.directory)
        try await simulator.waitUntilListening()
        let brokers = try TestEnvironment.kafkaBrokers()
        let deadLetters = "herald.dlq.rel-" + SecureRandom.hex(6)
        let admin = try KafkaAdmin(configuration: KafkaConfiguration(brokerList: brokers),
                                   logger: Logger(label: "test", minimumLevel: .warning))
        try await admin.createTopic(deadLetters, partitions: 1)
        admin.close()
        let untrusting = try DispatcherProcess(
            apps: apps, simulator: simulator, brokers: brokers, jobsTopic: ingest.topic, deadLetterTopic: deadLetters,
            group: "rel-tls-" + SecureRandom.hex(6), directory: ingest.directory, name: "dispatcher-no-ca",
            extra: ["HERALD_APNS_CA_FILE": "", "HERALD_RETRY_MAX_ATTEMPTS": "2",
                    "HERALD_APNS_INSECURE": "1", "HERALD_APNS_VERIFY": "false", "HERALD_APNS_TLS_VERIFY": "0",
                    "HERALD_TLS_INSECURE_SKIP_VERIFY": "true", "HERALD_APNS_SKIP_VERIFY": "1"])
        try await untrusting.waitForAssignment()

        let token = SecureRandom.hex(32)
        let push = try await ingest.request("POST", "/v1/apps/\(app.id)/devices/\(token)/push",
                                            headers: ["X-API-Key": app.secretKey],
                                            json: #"{"environment": "sandbox", "payload": {"aps": {"alert": "hi"}}}"#)
        #expect(push.status == 202, "\(push.text)")
        // Its connections fail verification (and keep failing as it retries); nothing reaches the simulator.
        try await eventually("the dispatcher refuses the certificate", timeout: .seconds(30)) {
            untrusting.child.log.components(separatedBy: "certificate verify failed").count > 3
        }
        #expect(simulator.acceptedCount() == 0, "the dispatcher trusted a certificate it had no CA for")
        #expect(await untrusting.metric("herald_apns_connections") == 0)
        await untrusting.child.stop()

        let trusting = try DispatcherProcess(
            apps: apps, simulator: simulator, brokers: brokers, jobsTopic: ingest.topic, deadLetterTopic: deadLetters,
            group: "rel-tls-" + SecureRandom.hex(6), directory: ingest.directory, name: "dispatcher-ca")
        try await trusting.waitForAssignment()
        let second = try await ingest.request("POST", "/v1/apps/\(app.id)/devices/\(token)/push",
                                              headers: ["X-API-Key": app.secretKey],
                                              json: #"{"environment": "sandbox", "payload": {"aps": {"alert": "again"}}}"#)
        #expect(second.status == 202, "\(second.text)")
        try await eventually("the push is delivered", timeout: .seconds(60)) { simulator.acceptedCount() >= 1 }
        await trusting.child.stop()
        await simulator.child.stop()

        let logs = [ingest.child.log, untrusting.child.log, trusting.child.log, simulator.child.log]
        #expect(logs.allSatisfy { !$0.contains(token) }, "the push token is logged")
        let scan = try ScanLogs.run([ingest.directory]) // its *.log files (links into HERALD_TEST_LOG_DIR when set)
        #expect(scan.status == 0, "\(scan.output)")
        await ingest.stop(keepFiles: scan.status != 0)
    }
}

/// Found by scripts/ci/scan-logs: a failed delivery's error carried the whole record (librdkafka's consumer-only
/// `rd_kafka_message_errstr` returns the payload on a producer's report), so a dead letter that could not be written
/// logged its push token. The error must say what failed, never what was sent.
@Suite struct SecurityKafkaErrorTests {
    @Test func aFailedDeliveryDoesNotCarryTheRecord() async throws {
        let token = SecureRandom.hex(32)
        let unreachable = "127.0.0.1:\(try freePort())"
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(
            kafka: KafkaConfiguration(brokerList: unreachable), messageTimeout: .seconds(1)),
            logger: Logger(label: "test", minimumLevel: .error))
        do {
            _ = try await producer.send(topic: "herald.dlq", key: "app/device/\(token)",
                                        value: Array(#"{"deviceToken": "\#(token)"}"#.utf8))
            Issue.record("delivered to a broker that does not exist")
        } catch {
            #expect(error.code == .messageTimedOut, "\(error)")
            #expect(!"\(error)".contains(token), "\(error)")
        }
        await producer.close(timeout: .seconds(1))
    }
}

/// scripts/ci/scan-logs, run as CI runs it.
enum ScanLogs {
    static func run(_ paths: [String]) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = TestEnvironment.repositoryRoot.appendingPathComponent("scripts/ci/scan-logs")
        process.arguments = paths
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, output)
    }
}

/// The log scanner finds a push token and passes Herald's real log lines.
@Suite struct SecurityLogScanTests {
    static func scan(_ lines: [String]) throws -> (status: Int32, output: String) {
        let path = NSTemporaryDirectory() + "herald-scan-\(SecureRandom.hex(6)).log"
        try (lines.joined(separator: "\n") + "\n").write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        return try ScanLogs.run([path])
    }

    /// Lines as herald-ingest, herald-dispatcher and swift test write them, with every long hex value they carry.
    static let realLines = [
        #"{"ts":"2026-11-30T02:56:01.142Z","level":"info","logger":"herald.ingest","msg":"request","http.bytes_in":"0","http.bytes_out":"108","http.duration_ms":"2.573","http.method":"GET","http.request_id":"739f3aac9e9ec591832d91877233a714","http.route":"/v1/apps/{appID}/subscriptions","http.status":"400"}"#,
        #"{"ts":"2026-11-30T02:56:01.142Z","level":"info","logger":"herald.ingest","msg":"subscription saved","app":"shop","token":"sha256:8c2f0a5b71d3"}"#,
        #"{"ts":"2026-11-30T02:56:01.142Z","level":"warning","logger":"herald.ingest","msg":"kafka did not acknowledge in time","job.id":"4f1c9a0b2e7d4c3a9b8e7f6a5d4c3b2a","timeout":"5 seconds"}"#,
        #"{"ts":"2026-11-30T02:56:01.142Z","level":"info","logger":"herald.dispatcher","msg":"dead letter written","dlq.reason":"BadDeviceToken","token":"0a1b2c3d4e5f","app":"shop"}"#,
        #"  {"kind": "secret", "sha256": "fad81e64da6268491fa835caafafee65150f65ef7adfd2c22cccb9e13413f957"}"#,
        #"{"ts":"2026-11-30T03:00:42.429Z","level":"info","logger":"herald.ingest","msg":"subscription created","app":"app0-61e3d9e4","request.id":"78baa442817a9ecd3440d916f17835c4","token":"sha256:503c1cb71f8d","token.type":"alert"}"#,
        "process logs in /tmp/herald-proc-3fa9c2d1e0b7",
        "✔ Test everyEndpointRefusesEveryoneButItsOwnApp() passed after 4.108 seconds.",
        // swift-testing echoing a parameterized test's own inputs.
        #"◇ Test case passing 2 arguments body → "{"channel": "c", "deviceToken": "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"}", field → "channel" to rejects(body:field:) started."#,
        #"{"ts":"2026-11-30T02:56:01.142Z","level":"info","logger":"herald.dispatcher","msg":"assigned","kafka.member":"rdkafka-5c0e1f4e-7d0b-4f44-9a55-1b6f2c9d8e7a"}"#,
    ]

    @Test func realLogLinesPass() throws {
        let result = try Self.scan(Self.realLines)
        #expect(result.status == 0, "\(result.output)")
    }

    @Test func aLineWithAPushTokenFails() throws {
        let token = SecureRandom.hex(32)
        let cases = [
            #"{"level":"info","msg":"subscription saved","token":"\#(token)"}"#, // a JSON field that is not exempt
            #"{"level":"info","msg":"request","http.request_id":"abc","error":"bad token \#(token.uppercased())"}"#,
            "plain text: push to \(token) failed", // not JSON: no exemption at all
            #"{"msg":"x","http.request_id":"\#(token) and more"}"#, // exempt only as the field's whole value
            "\(SecureRandom.hex(80))", // a long Live Activity token on its own
            "✘ Test x() recorded an issue: Caught error: KafkaError(_MSG_TIMED_OUT): {\"deviceToken\": \"\(token)\"}",
        ]
        for line in cases {
            let result = try Self.scan(Self.realLines + [line])
            #expect(result.status == 1, "not caught: \(line)")
            #expect(!result.output.contains(token) && !result.output.contains(token.uppercased()),
                    "the scanner must not print the token it found")
        }
    }
}
