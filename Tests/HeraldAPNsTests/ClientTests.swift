import Foundation
import HeraldAPNs
import HeraldCrypto
import HeraldRuntime
import Synchronization
import Testing

/// The client against a real third-party HTTP/2 server (nghttpd over TLS) on loopback ports 20300–20329.
@Suite struct APNsClientTests {
    private func apnsError(_ body: () async throws -> Void) async -> APNsError? {
        do {
            try await body()
            return nil
        } catch {
            return error as? APNsError
        }
    }

    /// Every bearer token nghttpd saw, in order of first appearance.
    private func bearerTokens(in log: String) -> [String] {
        var seen: [String] = []
        for line in log.split(separator: "\n") {
            guard let range = line.range(of: "authorization: bearer ") else { continue }
            let token = String(line[range.upperBound...])
            if !seen.contains(token) { seen.append(token) }
        }
        return seen
    }

    @Test func roundTripSendsTheAPNsHeaders() async throws {
        let server = try NGHTTPServer(port: 20300, options: ["-v", "--echo-upload"])
        let client = try APNsClient(configuration: Fixtures.configuration(port: 20300), logger: Fixtures.logger,
                                    metrics: MetricsRegistry())
        let id = UUID()
        var alert = Fixtures.request(token: "ABCDEF" + Fixtures.token)
        alert.collapseID = "score-42"
        alert.apnsID = id
        alert.expiration = Date(timeIntervalSince1970: 1_900_000_000)
        let response = try await client.send(alert, credentials: Fixtures.credentials, environment: .production)
        #expect(response.status == 200 && response.isDelivered)

        let background = APNsRequest(deviceToken: Fixtures.token, pushType: .background, topic: "com.example.app",
                                     payload: Array(#"{"aps":{"content-available":1}}"#.utf8))
        #expect(try await client.send(background, credentials: Fixtures.credentials, environment: .sandbox).status == 200)
        await client.shutdown()

        // nghttpd writes its -v log asynchronously: give the last frames a moment to arrive.
        for _ in 0..<40 where !server.log.contains("recv GOAWAY frame") { try await Task.sleep(for: .milliseconds(50)) }
        let log = server.log
        #expect(log.contains("The negotiated protocol: h2"))
        #expect(log.contains(":method: POST"))
        #expect(log.contains(":path: /3/device/abcdef\(Fixtures.token)"))
        #expect(log.contains(":authority: localhost:20300"))
        #expect(log.contains("apns-push-type: alert"))
        #expect(log.contains("apns-push-type: background"))
        #expect(log.contains("apns-topic: com.example.app"))
        #expect(log.contains("apns-priority: 10"))
        #expect(log.contains("apns-priority: 5"))
        #expect(log.contains("apns-collapse-id: score-42"))
        #expect(log.contains("apns-id: \(id.uuidString.lowercased())"))
        #expect(log.contains("content-length: \(alert.payload.count)"))
        // Only the alert carried an expiration; the background push sent none.
        #expect(log.components(separatedBy: "apns-expiration: ").count - 1 == 1)
        #expect(log.contains("apns-expiration: 1900000000"))
        #expect(bearerTokens(in: log).count == 1)
        #expect(log.contains("recv DATA frame <length=\(alert.payload.count), flags=0x01"))
        // shutdown() said goodbye with GOAWAY.
        #expect(log.contains("recv GOAWAY frame"))
        server.kill()
    }

    @Test func untrustedCertificateIsRefused() async throws {
        let server = try NGHTTPServer(port: 20301, options: ["--echo-upload"], key: TestPKI.shared.untrustedKey,
                                      certificate: TestPKI.shared.untrustedCertificate)
        // Trusting only the system store (plus the test CA, which did not sign this certificate).
        for trustTestCA in [false, true] {
            let client = try APNsClient(configuration: Fixtures.configuration(port: 20301, trustTestCA: trustTestCA),
                                        logger: Fixtures.logger, metrics: MetricsRegistry())
            let error = await apnsError {
                _ = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
            }
            #expect(error?.code == .tlsFailure, "\(String(describing: error))")
            #expect(error?.message.contains("certificate") == true, "\(String(describing: error))")
            #expect(error?.isRetriable == false)
            await client.shutdown()
        }
        server.kill()
    }

    /// A handshake the server ends with an alert (its fault, not its certificate's) may pass on the next
    /// connection: the error is one to retry, where a refused certificate is not.
    @Test func aServersHandshakeAlertIsRetriable() async throws {
        // Reads the ClientHello, answers a fatal internal_error alert and hangs up, every time; says when it listens.
        let script = """
            import socket, sys
            listener = socket.socket(); listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", 20318)); listener.listen(8)
            open(sys.argv[1], "w").close()
            while True:
                connection, _ = listener.accept(); connection.recv(65536)
                connection.sendall(bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x50])); connection.close()
            """
        let listening = NSTemporaryDirectory() + "herald-alert-server-" + UUID().uuidString
        let server = Process()
        server.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        server.arguments = ["python3", "-c", script, listening]
        (server.standardOutput, server.standardError) = (FileHandle.nullDevice, FileHandle.nullDevice)
        try server.run()
        // SIGKILL: the test process ignores SIGTERM, and its children inherit that.
        defer { kill(server.processIdentifier, SIGKILL) }
        let deadline = ContinuousClock.now + .seconds(10)
        while !FileManager.default.fileExists(atPath: listening), ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        try? FileManager.default.removeItem(atPath: listening)
        let client = try APNsClient(configuration: Fixtures.configuration(port: 20318), logger: Fixtures.logger,
                                    metrics: MetricsRegistry())
        let error = await apnsError {
            _ = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
        }
        #expect(error?.code == .connectionFailed, "\(String(describing: error))")
        #expect(error?.message.contains("internal error") == true, "\(String(describing: error))")
        #expect(error?.isRetriable == true)
        await client.shutdown()
    }

    /// `HERALD_APNS_CA_FILE` vouches only for the configured hosts that are not Apple's: a certificate it signed
    /// for api.push.apple.com is refused, the same certificate for another configured host accepted.
    @Test func theExtraCANeverVouchesForApplesHost() async throws {
        let server = try NGHTTPServer(port: 20313, options: ["--echo-upload"], key: TestPKI.shared.appleHostKey,
                                      certificate: TestPKI.shared.appleHostCertificate, tokens: [Fixtures.token])
        for (host, trusted) in [("api.push.apple.com", false), ("apns.test.example", true)] {
            var configuration = Fixtures.configuration(port: 20313, host: host)
            configuration.addressOverrides = [host: "127.0.0.1"]
            let client = try APNsClient(configuration: configuration, logger: Fixtures.logger, metrics: MetricsRegistry())
            if trusted {
                let response = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
                #expect(response.status == 200, "\(host)")
            } else {
                let error = await apnsError {
                    _ = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
                }
                #expect(error?.code == .tlsFailure, "\(host): \(String(describing: error))")
                #expect(error?.message.contains("certificate verify failed") == true, "\(String(describing: error))")
            }
            await client.shutdown()
        }
        server.kill()
    }

    @Test func hostNameMismatchIsRefused() async throws {
        // Signed by the trusted test CA, but for wrong.example, not localhost or 127.0.0.1.
        let server = try NGHTTPServer(port: 20302, options: ["--echo-upload"], key: TestPKI.shared.wrongHostKey,
                                      certificate: TestPKI.shared.wrongHostCertificate)
        for host in ["localhost", "127.0.0.1"] {
            let client = try APNsClient(configuration: Fixtures.configuration(port: 20302, host: host),
                                        logger: Fixtures.logger, metrics: MetricsRegistry())
            let error = await apnsError {
                _ = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
            }
            #expect(error?.code == .tlsFailure, "\(String(describing: error))")
            #expect(error?.message.contains("mismatch") == true, "\(String(describing: error))")
            await client.shutdown()
        }
        server.kill()
    }

    @Test(arguments: [(UInt16(20303), ["-alpn", "http/1.1"]), (UInt16(20311), [])])
    func serverWithoutH2IsRefused(port: UInt16, alpnOptions: [String]) async throws {
        // TLS servers that offer only http/1.1 (they refuse the handshake) or no ALPN at all (it completes).
        try ensurePortIsFree(port)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["openssl", "s_server", "-accept", "127.0.0.1:\(port)", "-cert", TestPKI.shared.serverCertificate,
                             "-key", TestPKI.shared.serverKey, "-quiet"] + alpnOptions
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        defer {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        try waitUntilListening(port: port)
        let client = try APNsClient(configuration: Fixtures.configuration(port: port), logger: Fixtures.logger,
                                    metrics: MetricsRegistry())
        let error = await apnsError {
            _ = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
        }
        #expect(error?.code == .http2NotNegotiated, "\(String(describing: error))")
        #expect(error?.isRetriable == false)
        await client.shutdown()
    }

    @Test func manyConcurrentRequestsShareStreamsUpToTheServerLimit() async throws {
        let server = try NGHTTPServer(port: 20304, options: ["-m", "16", "--echo-upload"])
        let client = try APNsClient(configuration: Fixtures.configuration(port: 20304), logger: Fixtures.logger,
                                    metrics: MetricsRegistry())
        let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<400 {
                group.addTask {
                    try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production).status
                }
            }
            return try await group.reduce(into: [Int]()) { $0.append($1) }
        }
        #expect(statuses.count == 400 && statuses.allSatisfy { $0 == 200 })
        let connections = await client.connections()
        #expect(connections.count == 1)
        let connection = try #require(connections.first)
        #expect(connection.maximumConcurrentStreams == 16)
        #expect(connection.streamsOpened == 400)
        #expect(connection.peakActiveStreams > 1 && connection.peakActiveStreams <= 16)
        await client.shutdown()
        server.kill()
    }

    @Test func poolConnectsOneAfterAnotherWithoutWaitingOutTheStagger() async throws {
        let server = try NGHTTPServer(port: 20314, options: ["--echo-upload"])
        var configuration = Fixtures.configuration(port: 20314)
        configuration.connectionsPerEndpoint = 3
        configuration.connectionStagger = .seconds(60)
        let client = try APNsClient(configuration: configuration, logger: Fixtures.logger, metrics: MetricsRegistry())
        let response = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
        #expect(response.status == 200)
        // Each connection opens when the one before is ready: all three well before the first stagger is due.
        #expect(await eventually { await client.connections().filter { $0.state == "ready" }.count == 3 })
        await client.shutdown()
        server.kill()
    }

    @Test func serverKilledMidFlightFailsEveryPendingRequestAsRetriable() async throws {
        let server = try NGHTTPServer(port: 20305, tokens: [Fixtures.token])
        let client = try APNsClient(configuration: Fixtures.configuration(port: 20305), logger: Fixtures.logger,
                                    metrics: MetricsRegistry())
        #expect(try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production).status == 200)
        server.pause()
        let started = ContinuousClock.now
        let outcomes = try await withThrowingTaskGroup(of: APNsError?.self) { group in
            for _ in 0..<50 {
                group.addTask {
                    await self.apnsError {
                        _ = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
                    }
                }
            }
            let inFlight = await eventually { await client.connections().map(\.activeStreams).reduce(0, +) == 50 }
            #expect(inFlight)
            server.kill()
            return try await group.reduce(into: [APNsError?]()) { $0.append($1) }
        }
        #expect(ContinuousClock.now - started < .seconds(4), "resolved by the connection loss, not by timeouts")
        #expect(outcomes.count == 50)
        for outcome in outcomes {
            #expect(outcome?.code == .connectionFailed && outcome?.isRetriable == true, "\(String(describing: outcome))")
        }
        await client.shutdown()
    }

    @Test func clientReconnectsAfterTheServerRestarts() async throws {
        let server = try NGHTTPServer(port: 20306, tokens: [Fixtures.token])
        let metrics = MetricsRegistry()
        let client = try APNsClient(configuration: Fixtures.configuration(port: 20306), logger: Fixtures.logger,
                                    metrics: metrics)
        #expect(try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production).status == 200)
        server.kill()
        // While it is down: fast, retryable failures.
        let down = await apnsError {
            _ = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
        }
        #expect(down?.isRetriable == true, "\(String(describing: down))")
        try server.start()
        let recovered = await eventually(timeout: .seconds(5)) {
            (try? await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production).status) == 200
        }
        #expect(recovered)
        #expect(metrics.counter("herald_apns_reconnects_total", help: "").labels().current >= 1)
        #expect(metrics.gauge("herald_apns_connections", help: "").labels().current == 1)
        await client.shutdown()
        #expect(metrics.gauge("herald_apns_connections", help: "").labels().current == 0)
        server.kill()
    }

    @Test func silentServerTimesOutRequests() async throws {
        let server = try NGHTTPServer(port: 20307, tokens: [Fixtures.token])
        var configuration = Fixtures.configuration(port: 20307)
        configuration.requestTimeout = .milliseconds(400)
        let client = try APNsClient(configuration: configuration, logger: Fixtures.logger, metrics: MetricsRegistry())
        #expect(try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production).status == 200)
        server.pause()
        let started = ContinuousClock.now
        let error = await apnsError {
            _ = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
        }
        let elapsed = ContinuousClock.now - started
        #expect(error?.code == .timeout && error?.isRetriable == true, "\(String(describing: error))")
        #expect(elapsed >= .milliseconds(400) && elapsed < .seconds(2))
        // The timed-out stream was reset, so it no longer holds a stream slot.
        #expect(await eventually { await client.connections().first?.activeStreams == 0 })
        await client.shutdown()
        server.kill()
    }

    @Test func unansweredPingClosesTheConnection() async throws {
        let server = try NGHTTPServer(port: 20312, tokens: [Fixtures.token])
        let metrics = MetricsRegistry()
        var configuration = Fixtures.configuration(port: 20312)
        configuration.pingInterval = .milliseconds(150)
        configuration.pingTimeout = .milliseconds(300)
        let client = try APNsClient(configuration: configuration, logger: Fixtures.logger, metrics: metrics)
        #expect(try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production).status == 200)
        let connections = metrics.gauge("herald_apns_connections", help: "").labels()
        // Idle but answering PINGs: the connection stays.
        try await Task.sleep(for: .milliseconds(700))
        #expect(connections.current == 1)
        server.pause()
        #expect(await eventually(timeout: .seconds(3)) { connections.current == 0 })
        server.resume()
        #expect(await eventually(timeout: .seconds(5)) { connections.current == 1 })
        await client.shutdown()
        server.kill()
    }

    /// A request that times out sends a PING at once: a connection that stopped answering is replaced within the
    /// request and PING timeouts, long before the idle PING would have found it.
    @Test func aTimedOutRequestChecksItsConnectionAtOnce() async throws {
        let server = try NGHTTPServer(port: 20317, tokens: [Fixtures.token])
        let metrics = MetricsRegistry()
        var configuration = Fixtures.configuration(port: 20317)
        configuration.pingInterval = .seconds(60)
        configuration.pingTimeout = .milliseconds(300)
        configuration.requestTimeout = .milliseconds(300)
        let client = try APNsClient(configuration: configuration, logger: Fixtures.logger, metrics: metrics)
        #expect(try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production).status == 200)
        let connections = metrics.gauge("herald_apns_connections", help: "").labels()
        server.pause()
        let error = await apnsError {
            _ = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
        }
        #expect(error?.code == .timeout, "\(String(describing: error))")
        #expect(await eventually(timeout: .seconds(2)) { connections.current == 0 })
        server.resume()
        #expect(try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production).status == 200)
        await client.shutdown()
        server.kill()
    }

    @Test func listenerThatNeverHandshakesTimesOut() async throws {
        // Accepts TCP (the kernel completes the handshake from the backlog) but never speaks TLS.
        let fd = try loopbackListener(port: 20308)
        defer { close(fd) }
        var configuration = Fixtures.configuration(port: 20308, host: "127.0.0.1")
        configuration.requestTimeout = .milliseconds(300)
        let client = try APNsClient(configuration: configuration, logger: Fixtures.logger, metrics: MetricsRegistry())
        let error = await apnsError {
            _ = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
        }
        #expect(error?.code == .timeout, "\(String(describing: error))")
        await client.shutdown()
    }

    /// An address that drops the connect (a full accept queue: the SYN goes unanswered, like IPv6 without a route)
    /// costs `addressConnectTimeout`, then the next address is tried, whichever of the two comes first.
    @Test func anAddressThatDropsTheConnectIsLeftForTheNext() async throws {
        let server = try NGHTTPServer(port: 20319, tokens: [Fixtures.token])
        defer { server.kill() }
        let blackHole = try loopbackListener(port: 20319, address: "127.0.0.2", backlog: 0)
        defer { close(blackHole) }
        let filler = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(filler) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(20319).bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.2")
        let filled = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(filler, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        try #require(filled == 0, "the black hole's one backlog place")
        for order in ["127.0.0.2,127.0.0.1", "127.0.0.1,127.0.0.2"] {
            var configuration = Fixtures.configuration(port: 20319)
            configuration.addressOverrides = ["localhost": order]
            configuration.connectTimeout = .seconds(10)
            configuration.addressConnectTimeout = .milliseconds(500)
            configuration.requestTimeout = .seconds(8)
            let client = try APNsClient(configuration: configuration, logger: Fixtures.logger, metrics: MetricsRegistry())
            let started = ContinuousClock.now
            let response = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
            #expect(response.status == 200, "\(order)")
            #expect(ContinuousClock.now - started < .seconds(3), "\(order): \(ContinuousClock.now - started)")
            await client.shutdown()
        }
    }

    /// A peer that closes or resets the connection during the TLS handshake, with no alert, is a connection
    /// failure and retriable: nothing refused a certificate, so the pushes waiting for it must not be given up.
    @Test func aConnectionDroppedDuringTheHandshakeIsRetriable() async throws {
        for (port, reset) in [(UInt16(20315), false), (UInt16(20316), true)] {
            let fd = try loopbackListener(port: port)
            defer { close(fd) } // with whatever later attempts wait in its backlog
            // Takes the first connection's ClientHello, then closes it (FIN) or resets it (RST: a linger of 0).
            Thread {
                let connection = accept(fd, nil, nil)
                guard connection >= 0 else { return }
                var hello = [UInt8](repeating: 0, count: 4096)
                _ = read(connection, &hello, hello.count)
                if reset {
                    var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
                    setsockopt(connection, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
                }
                close(connection)
            }.start()
            var configuration = Fixtures.configuration(port: port, host: "127.0.0.1")
            configuration.requestTimeout = .seconds(5)
            let client = try APNsClient(configuration: configuration, logger: Fixtures.logger, metrics: MetricsRegistry())
            let error = await apnsError {
                _ = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
            }
            #expect(error?.code == .connectionFailed, "reset \(reset): \(String(describing: error))")
            #expect(error?.message.contains("TLS handshake") == true, "\(String(describing: error))")
            #expect(error?.isRetriable == true)
            await client.shutdown()
        }
    }

    @Test func shutdownResolvesPendingRequests() async throws {
        let server = try NGHTTPServer(port: 20309, tokens: [Fixtures.token])
        let client = try APNsClient(configuration: Fixtures.configuration(port: 20309), logger: Fixtures.logger,
                                    metrics: MetricsRegistry())
        #expect(try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production).status == 200)
        server.pause()
        let outcomes = await withTaskGroup(of: APNsError?.self) { group in
            for _ in 0..<10 {
                group.addTask {
                    await self.apnsError {
                        _ = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
                    }
                }
            }
            _ = await eventually { await client.connections().map(\.activeStreams).reduce(0, +) == 10 }
            await client.shutdown(gracePeriod: .milliseconds(200))
            return await group.reduce(into: [APNsError?]()) { $0.append($1) }
        }
        #expect(outcomes.count == 10 && outcomes.allSatisfy { $0?.code == .shutdown })
        let after = await apnsError {
            _ = try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production)
        }
        #expect(after?.code == .shutdown)
        server.kill()
    }

    @Test func oneProviderTokenIsSharedAndRefreshedPerWindow() async throws {
        let server = try NGHTTPServer(port: 20310, options: ["-v", "--echo-upload"])
        let clock = TestClock()
        clock.advance(by: 120) // two minutes into a 30-minute window
        let metrics = MetricsRegistry()
        var configuration = Fixtures.configuration(port: 20310)
        configuration.connectionsPerEndpoint = 2
        configuration.providerTokenWindow = .seconds(30 * 60)
        configuration.providerTokenMinimumInterval = .seconds(20 * 60)
        let client = try APNsClient(configuration: configuration, logger: Fixtures.logger, metrics: metrics,
                                    now: { clock.now })
        func burst(_ count: Int) async throws {
            try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<count {
                    group.addTask {
                        try await client.send(Fixtures.request(), credentials: Fixtures.credentials, environment: .production).status
                    }
                }
                for try await status in group { #expect(status == 200) }
            }
        }
        try await burst(300)
        // Both connections are up before the second burst, so it spreads over them.
        #expect(await eventually { await client.connections().filter { $0.state == "ready" }.count == 2 })
        try await burst(300)
        let connections = await client.connections()
        #expect(connections.count == 2 && connections.allSatisfy { $0.streamsOpened > 0 })
        #expect(bearerTokens(in: server.log).count == 1)
        #expect(server.log.contains("[id=2]"))

        clock.advance(by: 28 * 60)
        try await burst(50)
        #expect(bearerTokens(in: server.log).count == 1)
        clock.advance(by: 2 * 60)
        try await burst(50)
        #expect(bearerTokens(in: server.log).count == 2)
        #expect(metrics.counter("herald_apns_provider_token_refreshes_total", help: "").labels().current == 2)
        await client.shutdown()
        server.kill()
    }
}
