import Foundation
import HeraldAPNs
import HeraldAPNsSimulator
import HeraldCrypto
import HeraldRuntime
import Testing

/// An in-process `APNsSimulator` on 127.0.0.1:`port` with its own CA and one generated provider key, recording
/// accepted and rejected requests, and a client configuration that trusts that CA.
final class SimulatorFixture: @unchecked Sendable {  // @unchecked: `simulator` is replaced only by `restart()`, from the test's own task.
    let port: UInt16
    let directory: String
    let files: SimulatorCertificates.Files
    let credentials: APNsCredentials
    private var configuration: APNsSimulatorConfiguration
    private(set) var simulator: APNsSimulator

    static let topic = "com.example.app"

    init(port: UInt16, rules: [SimulatorRule] = [], maxConcurrentStreams: Int = 1000,
         configure: (inout APNsSimulatorConfiguration) -> Void = { _ in }) throws {
        self.port = port
        directory = NSTemporaryDirectory() + "herald-apns-sim-client-\(port)-" + SecureRandom.hex(4)
        files = try SimulatorCertificates.generate(directory: directory + "/tls")
        let key = try PrivateKey.generateP256()
        credentials = APNsCredentials(teamID: "TEAM123456", keyID: "KEY1234567", privateKey: key)
        configuration = APNsSimulatorConfiguration(
            listen: HostPort(host: "127.0.0.1", port: port), certificateChainPath: files.serverCertificate,
            privateKeyPath: files.serverKey,
            providerKeys: [ProviderKey(teamID: credentials.teamID, keyID: credentials.keyID, publicKey: key.publicKey)],
            allowedTopics: [Self.topic], rules: rules, recordPath: directory + "/accepted.jsonl",
            rejectedRecordPath: directory + "/rejected.jsonl", maxConcurrentStreams: maxConcurrentStreams)
        configuration.manageListen = HostPort(host: "127.0.0.1", port: 0)
        configuration.broadcastRecordPath = directory + "/broadcasts.jsonl"
        configure(&configuration)
        try ensurePortIsFree(port)
        simulator = try Self.makeSimulator(configuration)
        try simulator.start()
    }

    private static func makeSimulator(_ configuration: APNsSimulatorConfiguration) throws -> APNsSimulator {
        try APNsSimulator(configuration: configuration, logger: Logger(label: "apns-sim", minimumLevel: .error),
                          metrics: MetricsRegistry())
    }

    deinit {
        simulator.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Stops the simulator: GOAWAY on every connection, then the connections and the listener close.
    func stop() async {
        simulator.stop()
        await simulator.waitUntilStopped()
    }

    /// A new simulator on the same port, files and rules (after `stop()`).
    func restart() throws {
        simulator = try Self.makeSimulator(configuration)
        try simulator.start()
    }

    func clientConfiguration() -> APNsConfiguration {
        var configuration = APNsConfiguration()
        configuration.productionURL = "https://127.0.0.1:\(port)"
        configuration.sandboxURL = "https://127.0.0.1:\(port)"
        configuration.manageProductionURL = "https://127.0.0.1:\(simulator.managePort)"
        configuration.manageSandboxURL = "https://127.0.0.1:\(simulator.managePort)"
        configuration.extraCAFile = files.caCertificate
        configuration.connectionsPerEndpoint = 2
        configuration.connectionStagger = .zero
        configuration.requestTimeout = .seconds(5)
        configuration.connectTimeout = .seconds(3)
        configuration.reconnectInitialDelay = .milliseconds(50)
        configuration.reconnectMaximumDelay = .milliseconds(400)
        return configuration
    }

    func client(metrics: MetricsRegistry = MetricsRegistry(), now: @escaping @Sendable () -> Date = { Date() },
                configure: (inout APNsConfiguration) -> Void = { _ in }) throws -> APNsClient {
        var configuration = clientConfiguration()
        configure(&configuration)
        return try APNsClient(configuration: configuration, logger: Logger(label: "apns-test", minimumLevel: .error),
                              metrics: metrics, now: now)
    }

    /// What the simulator accepted (one JSON object per push).
    func accepted() throws -> [JSONValue] { try Self.lines(directory + "/accepted.jsonl") }
    /// What the simulator refused (one JSON object per request).
    func rejected() throws -> [JSONValue] { try Self.lines(directory + "/rejected.jsonl") }
    /// What the simulator accepted as broadcasts.
    func broadcasts() throws -> [JSONValue] { try Self.lines(directory + "/broadcasts.jsonl") }

    private static func lines(_ path: String) throws -> [JSONValue] {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return [] }
        return try text.split(separator: "\n").map { try JSONDecoder().decode(JSONValue.self, from: Data($0.utf8)) }
    }

    /// A random device token (32 bytes) whose hex starts with `prefix`.
    static func token(_ prefix: String = "") -> String {
        prefix + SecureRandom.hex(32).dropFirst(prefix.count)
    }

    static func alert(_ token: String, topic: String = topic) -> APNsRequest {
        APNsRequest(deviceToken: token, pushType: .alert, topic: topic,
                    payload: Array(#"{"aps":{"alert":{"title":"Hi","body":"Hello"}}}"#.utf8))
    }
}

/// Real time moved by an offset the test sets; `shiftNextReading` moves one reading only.
final class ShiftedClock: Sendable {
    private let state = Lock<(offset: TimeInterval, once: TimeInterval?)>((0, nil))

    init(offset: TimeInterval = 0) { state.withLock { $0.offset = offset } }

    var now: Date {
        state.withLock { state in
            let offset = state.once ?? state.offset
            state.once = nil
            return Date() + offset
        }
    }

    func set(offset: TimeInterval) { state.withLock { $0.offset = offset } }
    func shiftNextReading(by offset: TimeInterval) { state.withLock { $0.once = offset } }
}

/// `send` as a value: the response, or the error it threw.
func outcome(_ client: APNsClient, _ request: APNsRequest,
             _ credentials: APNsCredentials) async -> Result<APNsResponse, APNsError> {
    do {
        return .success(try await client.send(request, credentials: credentials, environment: .production))
    } catch let error as APNsError {
        return .failure(error)
    } catch {
        return .failure(APNsError(.protocolError, "unexpected \(error)"))
    }
}

/// HeraldAPNs against HeraldAPNsSimulator in-process, over TLS, on loopback ports 20510–20529.
@Suite struct ClientAgainstSimulatorTests {
    @Test func deliversWhatAPNsRecordsWithTheRightHeaders() async throws {
        let fixture = try SimulatorFixture(port: 20510)
        let client = try fixture.client()
        let id = UUID()
        let alertToken = "ABCDEF" + SimulatorFixture.token().dropFirst(6)
        var alert = APNsRequest(deviceToken: alertToken, pushType: .alert, topic: SimulatorFixture.topic,
                                payload: Array(#"{"aps":{"alert":{"title":"Hi","body":"Hello"}},"match":42}"#.utf8))
        alert.priority = .powerConsiderate
        alert.collapseID = "score-42"
        alert.expiration = Date(timeIntervalSince1970: 1_900_000_000)
        alert.apnsID = id
        let backgroundToken = SimulatorFixture.token()
        let background = APNsRequest(deviceToken: backgroundToken, pushType: .background, topic: SimulatorFixture.topic,
                                     payload: Array(#"{"aps":{"content-available":1}}"#.utf8))
        let activityToken = SimulatorFixture.token()
        let activity = APNsRequest(
            deviceToken: activityToken, pushType: .liveactivity, topic: SimulatorFixture.topic + ".push-type.liveactivity",
            payload: Array(#"{"aps":{"timestamp":1700000000,"event":"update","content-state":{"score":"1-0"}}}"#.utf8))

        let alertResponse = try await client.send(alert, credentials: fixture.credentials, environment: .production)
        #expect(alertResponse.status == 200 && alertResponse.isDelivered)
        #expect(alertResponse.apnsID == id.uuidString.lowercased())
        for request in [background, activity] {
            let response = try await client.send(request, credentials: fixture.credentials, environment: .sandbox)
            #expect(response.status == 200, "\(response)")
            #expect(response.apnsID.map { UUID(uuidString: $0) != nil } == true)
        }
        await client.shutdown()

        let records = try fixture.accepted()
        try #require(records.count == 3)
        func record(_ token: String) throws -> JSONValue {
            try #require(records.first { $0["token"]?.stringValue == token.lowercased() })
        }
        let first = try record(alertToken)
        #expect(first["topic"]?.stringValue == SimulatorFixture.topic)
        #expect(first["pushType"]?.stringValue == "alert")
        #expect(first["priority"]?.numberValue == 5)
        #expect(first["collapseId"]?.stringValue == "score-42")
        #expect(first["expiration"]?.numberValue == 1_900_000_000)
        #expect(first["apnsId"]?.stringValue == id.uuidString.lowercased())
        #expect(first["payload"]?["match"]?.numberValue == 42)
        #expect(first["payload"]?["aps"]?["alert"]?["body"]?.stringValue == "Hello")
        let second = try record(backgroundToken)
        #expect(second["pushType"]?.stringValue == "background")
        #expect(second["priority"]?.numberValue == 5)
        #expect(second["expiration"] == .null && second["collapseId"] == .null)
        #expect(second["payload"]?["aps"]?["content-available"]?.numberValue == 1)
        let third = try record(activityToken)
        #expect(third["topic"]?.stringValue == SimulatorFixture.topic + ".push-type.liveactivity")
        #expect(third["pushType"]?.stringValue == "liveactivity")
        #expect(third["priority"]?.numberValue == 10)
        #expect(third["payload"]?["aps"]?["content-state"]?["score"]?.stringValue == "1-0")
        #expect(try fixture.rejected().isEmpty)
    }

    @Test func oneProviderTokenForEveryRequestAndConnectionUntilItsWindowEnds() async throws {
        // The client's clock starts 2 minutes into the 30-minute window before the real one, so the next window's
        // token is not from the simulator's future; that first token is up to an hour old in real time, so the
        // simulator's age limit is raised for this test (the 20-minute rule per connection still holds).
        let fixture = try SimulatorFixture(port: 20511) { $0.providerTokenMaximumAge = .seconds(2 * 3600) }
        let metrics = MetricsRegistry()
        let real = Date().timeIntervalSince1970, window = 1800.0
        let realWindow = (real / window).rounded(.down) * window
        let clock = ShiftedClock(offset: realWindow - window + 120 - real)
        let client = try fixture.client(metrics: metrics, now: { clock.now })
        func burst(_ count: Int) async throws {
            try await withThrowingTaskGroup(of: APNsResponse.self) { group in
                for _ in 0..<count {
                    group.addTask {
                        try await client.send(SimulatorFixture.alert(SimulatorFixture.token()),
                                              credentials: fixture.credentials, environment: .production)
                    }
                }
                for try await response in group { #expect(response.status == 200, "\(response)") }
            }
        }
        try await burst(300)
        #expect(await eventually { await client.connections().filter { $0.state == "ready" }.count == 2 })
        try await burst(300)
        // 29 minutes into the window by the client's clock: the same token.
        clock.set(offset: realWindow - window + 29 * 60 - real)
        try await burst(100)
        var records = try fixture.accepted()
        #expect(records.count == 700)
        #expect(Set(records.compactMap { $0["connection"]?.numberValue }).count == 2)
        #expect(Set(records.compactMap { $0["providerTokenIssuedAt"]?.numberValue }).count == 1)
        let refreshes = metrics.counter("herald_apns_provider_token_refreshes_total", help: "").labels()
        #expect(refreshes.current == 1)

        // The next window, a minute in: re-signed once, and the simulator accepts the switch (30 minutes apart).
        clock.set(offset: realWindow + 61 - real)
        try await burst(100)
        records = try fixture.accepted()
        #expect(records.count == 800)
        let issued = records.compactMap { $0["providerTokenIssuedAt"]?.numberValue }
        #expect(Set(issued).count == 2)
        #expect(issued.first == realWindow - window && Set(issued.suffix(100)) == [realWindow])
        #expect(refreshes.current == 2)
        #expect(try fixture.rejected().isEmpty, "no TooManyProviderTokenUpdates or ExpiredProviderToken")
        await client.shutdown()
    }

    @Test func expiredProviderTokenIsRefreshedAndTheRequestSentOnceMore() async throws {
        let fixture = try SimulatorFixture(port: 20512)
        let metrics = MetricsRegistry()
        let clock = ShiftedClock()
        // The first token is signed "two hours ago": APNs answers 403 ExpiredProviderToken.
        clock.shiftNextReading(by: -2 * 3600)
        let client = try fixture.client(metrics: metrics, now: { clock.now })
        let token = SimulatorFixture.token()
        let response = try await client.send(SimulatorFixture.alert(token), credentials: fixture.credentials,
                                             environment: .production)
        #expect(response.status == 200, "\(response)")
        #expect(metrics.counter("herald_apns_provider_token_refreshes_total", help: "").labels().current == 2)
        let rejected = try fixture.rejected()
        #expect(rejected.count == 1 && rejected.first?["reason"]?.stringValue == "ExpiredProviderToken")
        let accepted = try fixture.accepted()
        #expect(accepted.count == 1 && accepted.first?["token"]?.stringValue == token)
        let issuedAt = try #require(accepted.first?["providerTokenIssuedAt"]?.numberValue)
        // Issued at the start of the five minutes a minute ago was in.
        let now = Date().timeIntervalSince1970
        #expect(issuedAt <= now - 60 && now - 60 - issuedAt < 5 * 60 && issuedAt.truncatingRemainder(dividingBy: 300) == 0)

        // The fresh token is the one kept: the next push uses it without signing again.
        #expect(try await client.send(SimulatorFixture.alert(token), credentials: fixture.credentials,
                                      environment: .production).status == 200)
        #expect(metrics.counter("herald_apns_provider_token_refreshes_total", help: "").labels().current == 2)
        #expect(try fixture.rejected().count == 1)
        await client.shutdown()
    }

    @Test func appleErrorsMapToReasonsAndDispositions() async throws {
        struct Case: Sendable {
            var name: String
            var request: APNsRequest
            var status: Int
            var reason: APNsReason
            var disposition: APNsDisposition
        }
        func ruled(_ prefix: String, _ status: Int, _ reason: String, _ disposition: APNsDisposition,
                   timestamp: Int64? = nil) -> (SimulatorRule, Case) {
            (SimulatorRule.fail(tokenPrefix: prefix, status: status, reason: reason, timestamp: timestamp),
             Case(name: reason, request: SimulatorFixture.alert(SimulatorFixture.token(prefix)), status: status,
                  reason: APNsReason(reason), disposition: disposition))
        }
        let programmed = [
            ruled("a1", 410, "Unregistered", .removeToken, timestamp: 1_700_000_000_123),
            ruled("a2", 410, "ExpiredToken", .removeToken),
            ruled("a3", 400, "DeviceTokenNotForTopic", .removeToken),
            ruled("a4", 429, "TooManyRequests", .retry),
            ruled("a5", 500, "InternalServerError", .retry),
            ruled("a6", 503, "ServiceUnavailable", .retry),
            ruled("a7", 503, "Shutdown", .retry),
            ruled("c7", 400, "IdleTimeout", .retry),
            ruled("a8", 400, "BadCollapseId", .permanent),
            ruled("a9", 413, "PayloadTooLarge", .permanent),
            ruled("b1", 403, "Forbidden", .permanent),
            // Not Apple's, but an egress proxy's: any 5xx is worth a retry.
            ruled("b2", 502, "BadGateway", .retry),
            ruled("b3", 504, "GatewayTimeout", .retry),
        ]
        var background = APNsRequest(deviceToken: SimulatorFixture.token(), pushType: .background,
                                     topic: SimulatorFixture.topic,
                                     payload: Array(#"{"aps":{"content-available":1}}"#.utf8))
        background.priority = .immediate
        let natural = [
            // Hex the client accepts, but not a 32–100-byte token.
            Case(name: "short token", request: SimulatorFixture.alert("abcd"), status: 400, reason: .badDeviceToken,
                 disposition: .removeToken),
            Case(name: "bad topic", request: SimulatorFixture.alert(SimulatorFixture.token(), topic: "com..example"),
                 status: 400, reason: .badTopic, disposition: .permanent),
            Case(name: "other bundle", request: SimulatorFixture.alert(SimulatorFixture.token(), topic: "com.other.app"),
                 status: 400, reason: .topicDisallowed, disposition: .permanent),
            Case(name: "background at priority 10", request: background, status: 400, reason: .badPriority,
                 disposition: .permanent),
            Case(name: "live activity to the bare topic",
                 request: APNsRequest(deviceToken: SimulatorFixture.token(), pushType: .liveactivity,
                                      topic: SimulatorFixture.topic,
                                      payload: Array(#"{"aps":{"timestamp":1,"event":"end","content-state":{}}}"#.utf8)),
                 status: 400, reason: .invalidPushType, disposition: .permanent),
            Case(name: "alert without aps",
                 request: APNsRequest(deviceToken: SimulatorFixture.token(), pushType: .alert,
                                      topic: SimulatorFixture.topic, payload: Array(#"{"hello":1}"#.utf8)),
                 status: 400, reason: .unknown("BadPayload"), disposition: .permanent),
        ]
        let fixture = try SimulatorFixture(port: 20513, rules: programmed.map(\.0))
        let client = try fixture.client()
        let cases = programmed.map(\.1) + natural
        let responses = try await withThrowingTaskGroup(of: (Int, APNsResponse).self) { group in
            for (index, entry) in cases.enumerated() {
                group.addTask {
                    (index, try await client.send(entry.request, credentials: fixture.credentials, environment: .production))
                }
            }
            return try await group.reduce(into: [Int: APNsResponse]()) { $0[$1.0] = $1.1 }
        }
        for (index, entry) in cases.enumerated() {
            let response = try #require(responses[index])
            #expect(response.status == entry.status, "\(entry.name)")
            #expect(response.reason == entry.reason, "\(entry.name)")
            #expect(response.disposition == entry.disposition, "\(entry.name)")
            #expect(response.isRetriable == (entry.disposition == .retry), "\(entry.name)")
        }
        let unregistered = try #require(responses[0])
        #expect(unregistered.timestamp == Date(timeIntervalSince1970: 1_700_000_000.123))
        #expect(responses[1]?.timestamp != nil, "410 without a programmed timestamp carries the time of the request")
        #expect(responses.values.allSatisfy { $0.status == 410 || $0.timestamp == nil })

        // A key the simulator does not know (its own pool and token): 403 InvalidProviderToken, a permanent failure.
        let stranger = APNsCredentials(teamID: "TEAM123456", keyID: "OTHERKEY12", privateKey: try PrivateKey.generateP256())
        let refused = try await client.send(SimulatorFixture.alert(SimulatorFixture.token()), credentials: stranger,
                                            environment: .production)
        #expect(refused.status == 403 && refused.reason == .invalidProviderToken && refused.disposition == .permanent)
        #expect(try fixture.accepted().isEmpty)
        #expect(try fixture.rejected().count == cases.count + 1)
        // The same ids with another key (an apps file pointing one app at the wrong .p8): a pool of its own, so its
        // tokens never alternate with the right key's on one connection.
        let before = await client.connections().count
        let impostor = APNsCredentials(teamID: fixture.credentials.teamID, keyID: fixture.credentials.keyID,
                                       privateKey: try PrivateKey.generateP256())
        let wrongKey = try await client.send(SimulatorFixture.alert(SimulatorFixture.token()), credentials: impostor,
                                             environment: .production)
        #expect(wrongKey.status == 403 && wrongKey.reason == .invalidProviderToken)
        #expect(await client.connections().count > before, "the wrong key's requests went on the right key's connections")
        await client.shutdown()
    }

    @Test func concurrentSendsSucceedWhileTheServerStartsAtOneStream() async throws {
        let fixture = try SimulatorFixture(port: 20514, maxConcurrentStreams: 50)
        let client = try fixture.client()
        // All at once, before any connection exists: the first streams see SETTINGS_MAX_CONCURRENT_STREAMS = 1.
        let results = await withTaskGroup(of: Result<APNsResponse, APNsError>.self) { group in
            for _ in 0..<600 {
                group.addTask { await outcome(client, SimulatorFixture.alert(SimulatorFixture.token()), fixture.credentials) }
            }
            return await group.reduce(into: [Result<APNsResponse, APNsError>]()) { $0.append($1) }
        }
        let failures = results.filter { (try? $0.get().status) != 200 }
        #expect(failures.isEmpty, "\(failures.prefix(3))")
        #expect(try fixture.accepted().count == 600)
        let connections = await client.connections()
        #expect(connections.count == 2)
        for connection in connections {
            #expect(connection.maximumConcurrentStreams == 50)
            #expect(connection.peakActiveStreams > 1 && connection.peakActiveStreams <= 50, "\(connection)")
        }
        await client.shutdown()
    }

    /// A request cancelled on a full connection frees its stream when its RST_STREAM is written: the request
    /// waiting for that stream goes at once, not after the next thing the server sends (here nothing, for 15 s).
    @Test func aCancelledRequestsStreamGoesToTheNextAtOnce() async throws {
        let fixture = try SimulatorFixture(port: 20526, rules: [.delay(tokenPrefix: "5b0", milliseconds: 8_000)],
                                           maxConcurrentStreams: 1)
        let client = try fixture.client(configure: { $0.connectionsPerEndpoint = 1 })
        _ = try await client.send(SimulatorFixture.alert(SimulatorFixture.token()), credentials: fixture.credentials,
                                  environment: .production) // the connection is up, at one stream
        let held = Task { await outcome(client, SimulatorFixture.alert(SimulatorFixture.token("5b0")), fixture.credentials) }
        #expect(await eventually { await client.connections().first?.activeStreams == 1 }, "the slow request holds the one stream")
        let waiting = Task { await outcome(client, SimulatorFixture.alert(SimulatorFixture.token()), fixture.credentials) }
        try await Task.sleep(for: .milliseconds(200))
        held.cancel()
        let started = ContinuousClock.now
        let next = await waiting.value
        #expect((try? next.get().status) == 200, "\(next)")
        #expect(ContinuousClock.now - started < .seconds(2), "waited \(ContinuousClock.now - started)")
        _ = await held.value
        await client.shutdown()
    }

    @Test(.timeLimit(.minutes(1))) func goawayMidLoadLosesNothing() async throws {
        let fixture = try SimulatorFixture(port: 20515, rules: [.goaway(afterStreams: 40, reason: "Shutdown")])
        let metrics = MetricsRegistry()
        // A long timeout: a request left hanging shows up as a timeout below, not as a slow test on a busy box.
        let client = try fixture.client(metrics: metrics, configure: { $0.requestTimeout = .seconds(20) })
        let results = await withTaskGroup(of: Result<APNsResponse, APNsError>.self) { group in
            for _ in 0..<1000 {
                group.addTask { await outcome(client, SimulatorFixture.alert(SimulatorFixture.token()), fixture.credentials) }
            }
            return await group.reduce(into: [Result<APNsResponse, APNsError>]()) { $0.append($1) }
        }
        var delivered = 0, retryable = 0
        for result in results {
            switch result {
            case .success(let response) where response.status == 200: delivered += 1
            case .failure(let error) where error.isRetriable: retryable += 1
            default: Issue.record("neither delivered nor retryable: \(result)")
            }
        }
        #expect(results.count == 1000 && delivered + retryable == 1000)
        // Exactly what the simulator accepted was reported delivered: nothing lost, nothing sent twice.
        #expect(try fixture.accepted().count == delivered)
        // What was not delivered was refused by the server (not timed out, not lost with a connection), so the
        // caller may safely send it again.
        for case .failure(let error) in results { #expect(error.code == .notProcessed, "\(error)") }
        // Refused streams went out again on the replacement connections: without that, the first two connections
        // would have delivered 2 × 40 and refused the rest.
        #expect(delivered > 2 * 40, "delivered \(delivered), retryable \(retryable)")
        // At least one replacement was opened; whether the other original connection also reached its 40 streams
        // before the requests ran out depends on which one finished its handshake first.
        #expect(metrics.counter("herald_apns_reconnects_total", help: "").labels().current >= 1)
        await client.shutdown()
    }

    /// A server that sends GOAWAY to every new connection before answering anything gets reconnects spaced by the
    /// growing backoff, not a connect loop at handshake speed; the requests fail as retriable.
    @Test(.timeLimit(.minutes(1))) func goawayOnEveryNewConnectionBacksOff() async throws {
        let fixture = try SimulatorFixture(port: 20523, rules: [.goaway(afterStreams: 0, reason: "BadCertificateEnvironment")])
        let metrics = MetricsRegistry()
        let client = try fixture.client(metrics: metrics, configure: { configuration in
            configuration.requestTimeout = .seconds(1)
            // Backoff 0.2, 0.4, 0.8, 1.6 s: about 5 reconnects in the 3 s below, against dozens at handshake speed.
            (configuration.reconnectInitialDelay, configuration.reconnectMaximumDelay) = (.milliseconds(200), .seconds(2))
        })
        let started = ContinuousClock.now
        var errors: [APNsError] = []
        while ContinuousClock.now - started < .seconds(3) {
            switch await outcome(client, SimulatorFixture.alert(SimulatorFixture.token()), fixture.credentials) {
            case .failure(let error): errors.append(error)
            case .success(let response): Issue.record("answered \(response.status)")
            }
        }
        let reconnects = metrics.counter("herald_apns_reconnects_total", help: "").labels().current
        #expect(reconnects <= 8, "\(reconnects) reconnects in 3 s")
        #expect(errors.allSatisfy { $0.isRetriable }, "\(errors.prefix(3))")
        #expect(try fixture.accepted().isEmpty)
        await client.shutdown()
    }

    /// A server that answers 503 Shutdown on every new connection gets the same backoff as one that sends GOAWAY
    /// at once: the answer that retires a connection does not count as the connection having worked.
    @Test(.timeLimit(.minutes(1))) func shutdownOnEveryNewConnectionBacksOff() async throws {
        let fixture = try SimulatorFixture(port: 20529, rules: [.fail(tokenPrefix: nil, status: 503, reason: "Shutdown")])
        let metrics = MetricsRegistry()
        let client = try fixture.client(metrics: metrics, configure: { configuration in
            configuration.requestTimeout = .seconds(1)
            (configuration.reconnectInitialDelay, configuration.reconnectMaximumDelay) = (.milliseconds(200), .seconds(2))
        })
        let started = ContinuousClock.now
        var shutdowns = 0
        while ContinuousClock.now - started < .seconds(3) {
            switch await outcome(client, SimulatorFixture.alert(SimulatorFixture.token()), fixture.credentials) {
            case .success(let response):
                #expect(response.status == 503 && response.reason == .shutdown)
                shutdowns += 1
            case .failure(let error): #expect(error.isRetriable, "\(error)")
            }
        }
        let reconnects = metrics.counter("herald_apns_reconnects_total", help: "").labels().current
        #expect(shutdowns >= 1)
        #expect(reconnects <= 8, "\(reconnects) reconnects in 3 s")
        await client.shutdown()
    }

    /// APNs answers 503 Shutdown on a connection it is taking down, 400 IdleTimeout on one idle too long: the client
    /// stops using that connection (a retry there would meet the same answer) and opens a replacement.
    @Test(arguments: [(UInt16(20524), 503, "Shutdown"), (20530, 400, "IdleTimeout")])
    func aShutdownOrIdleTimeoutAnswerRetiresItsConnection(port: UInt16, status: Int, reason: String) async throws {
        let fixture = try SimulatorFixture(port: port, rules: [.fail(tokenPrefix: "ab", status: status, reason: reason)])
        let metrics = MetricsRegistry()
        let client = try fixture.client(metrics: metrics)
        let answer = try await client.send(SimulatorFixture.alert(SimulatorFixture.token("ab")), credentials: fixture.credentials,
                                           environment: .production)
        #expect(answer.status == status && answer.reason == APNsReason(reason))
        let reconnects = metrics.counter("herald_apns_reconnects_total", help: "")
        #expect(await eventually(timeout: .seconds(5)) { reconnects.labels().current >= 1 }, "a replacement was opened")
        for _ in 0..<20 {
            #expect(try await client.send(SimulatorFixture.alert(SimulatorFixture.token("00")), credentials: fixture.credentials,
                                          environment: .production).status == 200)
        }
        await client.shutdown()
    }

    @Test func aPoolUnusedForItsIdleLifetimeClosesItsConnections() async throws {
        let fixture = try SimulatorFixture(port: 20525)
        let metrics = MetricsRegistry()
        let client = try fixture.client(metrics: metrics, configure: { $0.idlePoolLifetime = .seconds(2) })
        let open = metrics.gauge("herald_apns_connections", help: "").labels()
        #expect(try await client.send(SimulatorFixture.alert(SimulatorFixture.token()), credentials: fixture.credentials,
                                      environment: .production).status == 200)
        #expect(await eventually(timeout: .seconds(5)) { await client.connections().count == 2 })
        // A rotated key's pool, say: nothing sent for the lifetime, so its connections close and stay closed.
        #expect(await eventually(timeout: .seconds(8)) { await client.connections().isEmpty })
        #expect(open.current == 0)
        try await Task.sleep(for: .milliseconds(500))
        #expect(await client.connections().isEmpty, "nothing reopened them")
        #expect(try await client.send(SimulatorFixture.alert(SimulatorFixture.token()), credentials: fixture.credentials,
                                      environment: .production).status == 200)
        await client.shutdown()
    }

    @Test func clientReconnectsAfterTheSimulatorRestarts() async throws {
        let fixture = try SimulatorFixture(port: 20516)
        let client = try fixture.client()
        let token = SimulatorFixture.token()
        #expect(try await client.send(SimulatorFixture.alert(token), credentials: fixture.credentials,
                                      environment: .production).status == 200)
        await fixture.stop()
        if case .failure(let error) = await outcome(client, SimulatorFixture.alert(token), fixture.credentials) {
            #expect(error.isRetriable, "\(error)")
        } else {
            Issue.record("a send to a stopped simulator succeeded")
        }
        try fixture.restart()
        let recovered = await eventually(timeout: .seconds(5)) {
            (try? await client.send(SimulatorFixture.alert(token), credentials: fixture.credentials,
                                    environment: .production).status) == 200
        }
        #expect(recovered)
        #expect(fixture.simulator.statistics.accepted >= 1)
        #expect(try fixture.accepted().count >= 2)
        await client.shutdown()
    }

    @Test func answerSlowerThanTheRequestTimeoutIsATypedTimeout() async throws {
        let fixture = try SimulatorFixture(port: 20517, rules: [.delay(tokenPrefix: "dd", milliseconds: 2000)])
        let client = try fixture.client(configure: { $0.requestTimeout = .milliseconds(300) })
        // Connected first, so the timeout measured is the answer's, not the handshake's.
        let quick = SimulatorFixture.token("ee")
        #expect(try await client.send(SimulatorFixture.alert(quick), credentials: fixture.credentials,
                                      environment: .production).status == 200)
        let slow = SimulatorFixture.token("dd")
        let started = ContinuousClock.now
        let result = await outcome(client, SimulatorFixture.alert(slow), fixture.credentials)
        let elapsed = ContinuousClock.now - started
        guard case .failure(let error) = result else { Issue.record("expected a timeout, got \(result)"); return }
        #expect(error.code == .timeout && error.isRetriable, "\(error)")
        // Generous upper bound: the box is shared and tests run in parallel; the answer would take 2 s.
        #expect(elapsed >= .milliseconds(300) && elapsed < .milliseconds(1800), "\(elapsed)")
        // The connection is still good, and the reset stream was never delivered.
        let after = SimulatorFixture.token("ee")
        #expect(try await client.send(SimulatorFixture.alert(after), credentials: fixture.credentials,
                                      environment: .production).status == 200)
        try await Task.sleep(until: started + .milliseconds(2300))
        #expect(try fixture.accepted().compactMap { $0["token"]?.stringValue } == [quick, after])
        await client.shutdown()
    }

    @Test func certificateTheClientDoesNotTrustIsRefused() async throws {
        let fixture = try SimulatorFixture(port: 20518)
        let otherCA = try SimulatorCertificates.generate(directory: fixture.directory + "/other-tls")
        for caFile in [nil, otherCA.caCertificate] {
            let client = try fixture.client(configure: { $0.extraCAFile = caFile })
            let result = await outcome(client, SimulatorFixture.alert(SimulatorFixture.token()), fixture.credentials)
            guard case .failure(let error) = result else { Issue.record("TLS accepted with CA \(caFile ?? "none")"); continue }
            #expect(error.code == .tlsFailure && !error.isRetriable, "\(error)")
            #expect(error.message.contains("certificate"), "\(error)")
            await client.shutdown()
        }
        #expect(try fixture.accepted().isEmpty)
    }

    /// The simulator sends every answer's apns-id never-indexed (HPACK): over one connection, far more answers
    /// than its dynamic table could hold, each still carries exactly the id of its own request.
    @Test func everyAnswerCarriesItsOwnAPNsID() async throws {
        let fixture = try SimulatorFixture(port: 20520)
        let client = try fixture.client(configure: { $0.connectionsPerEndpoint = 1 })
        let ids = (0..<500).map { _ in UUID() }
        let requests = ids.map { id in
            var request = SimulatorFixture.alert(SimulatorFixture.token())
            request.apnsID = id
            return request
        }
        let results = try await client.send(requests, credentials: fixture.credentials, environment: .production)
        // Answers to requests without an apns-id carry fresh ones, each different.
        let fresh = try await client.send((0..<200).map { _ in SimulatorFixture.alert(SimulatorFixture.token()) },
                                          credentials: fixture.credentials, environment: .production)
        await client.shutdown()
        #expect(results.count == 500)
        for (id, result) in zip(ids, results) {
            #expect((try? result.get().apnsID) == id.uuidString.lowercased(), "\(result)")
        }
        let freshIDs = fresh.compactMap { try? $0.get().apnsID }
        #expect(freshIDs.count == 200 && Set(freshIDs).count == 200)
        #expect(freshIDs.allSatisfy { UUID(uuidString: $0) != nil })
        #expect(Set(try fixture.accepted().compactMap { $0["connection"]?.numberValue }).count == 1)
    }

    @Test func batchSendReturnsOneOutcomePerRequestInOrder() async throws {
        let fixture = try SimulatorFixture(port: 20519, rules: [.fail(tokenPrefix: "0f", status: 410, reason: "Unregistered")])
        let metrics = MetricsRegistry()
        let client = try fixture.client(metrics: metrics)
        var requests = (0..<300).map { index in SimulatorFixture.alert(SimulatorFixture.token(index % 3 == 0 ? "0f" : "1")) }
        requests[7].deviceToken = "not-hex"
        let results = try await client.send(requests, credentials: fixture.credentials, environment: .production)
        #expect(results.count == 300)
        for (index, result) in results.enumerated() {
            switch (index, result) {
            case (7, .failure(let error)):
                #expect(error.code == .invalidRequest(.invalidDeviceToken))
            case (_, .success(let response)) where index % 3 == 0:
                #expect(response.status == 410 && response.disposition == .removeToken, "\(index)")
            case (_, .success(let response)):
                #expect(response.status == 200, "\(index)")
            default:
                Issue.record("request \(index): \(result)")
            }
        }
        let delivered = Set(try fixture.accepted().compactMap { $0["token"]?.stringValue })
        let expected = Set(requests.enumerated().filter { $0.offset % 3 != 0 && $0.offset != 7 }.map(\.element.deviceToken))
        #expect(delivered == expected)
        #expect(try fixture.rejected().count == 100)
        #expect(metrics.gauge("herald_apns_in_flight", help: "").labels().current == 0)
        // Requests of one key share a token with single sends.
        #expect(metrics.counter("herald_apns_provider_token_refreshes_total", help: "").labels().current == 1)
        await client.shutdown()
        // After shutdown every request of a batch fails as shutdown, none is lost.
        let late = try await client.send(Array(requests.prefix(5)), credentials: fixture.credentials, environment: .production)
        #expect(late.count == 5)
        for result in late {
            if case .failure(let error) = result { #expect(error.code == .shutdown) } else { Issue.record("\(result)") }
        }
    }
}
