import HeraldTestSupport
import Foundation
@testable import HeraldHTTP
import HeraldRuntime
import Synchronization
import Testing

/// A real server on a loopback port (port 0: the kernel picks a free one), talked to by a real socket client.
@Suite("HTTP server")
struct HTTPServerTests {
    struct Echo: Codable, Sendable {
        var appID: String
        var query: [String: String]
        var method: String
        var remote: String?
        var body: String
    }

    struct Subscribe: Decodable {
        var channel: String
        var count: Int
    }

    struct Leak: Error, CustomStringConvertible {
        var description: String { "secret-connection-string" }
    }

    static let logger = Logger(label: "http-test", minimumLevel: .warning)

    /// Starts a server, runs `body` with its port, and always stops it (checking that `run()` returns).
    func withServer(_ router: Router, metrics: MetricsRegistry = MetricsRegistry(),
                    configure: (inout HTTPServerConfiguration) -> Void = { _ in },
                    _ body: (HTTPServer, UInt16) async throws -> Void) async throws {
        var configuration = HTTPServerConfiguration(address: HostPort(host: "127.0.0.1", port: 0))
        configure(&configuration)
        let server = try HTTPServer(configuration: configuration, router: router, logger: Self.logger,
                                    metrics: metrics)
        let running = Task { try await server.run() }
        do {
            try await body(server, server.localAddress.port)
        } catch {
            running.cancel()
            _ = try? await running.value
            throw error
        }
        running.cancel()
        try await running.value
    }

    func standardRouter() -> Router {
        var router = Router()
        router.get("/v1/apps/{appID}/echo") { request in
            try .json(Echo(appID: try request.pathParameter("appID"), query: request.query,
                           method: request.method.rawValue, remote: request.remoteAddress, body: ""))
        }
        router.post("/v1/apps/{appID}/subscriptions") { request in
            let body = try request.decodeJSON(Subscribe.self)
            try await Task.sleep(for: .milliseconds(5))  // a real await, as Redis and Kafka calls will be
            return try .json(["channel": body.channel, "app": try request.pathParameter("appID"),
                              "count": String(body.count)], status: 201)
        }
        router.post("/upload", body: .any) { request in .text("got \(request.body.count)", status: 201) }
        router.get("/boom") { _ in throw Leak() }
        return router
    }

    // MARK: Routing

    @Test func routesWithDecodedParametersAndQuery() async throws {
        try await withServer(standardRouter()) { _, port in
            let response = try await onThread {
                try RawHTTPClient(port: port).request("GET", "/v1/apps/my%20app/echo?name=a%20b&sum=1+2&flag&enc=%2F")
            }
            #expect(response.status == 200)
            #expect(response.headers["content-type"] == "application/json")
            let echo = try JSONDecoder().decode(Echo.self, from: Data(response.body))
            #expect(echo.appID == "my app")
            #expect(echo.query == ["name": "a b", "sum": "1 2", "flag": "", "enc": "/"])
            #expect(echo.method == "GET")
            #expect(echo.remote == "127.0.0.1")
        }
    }

    @Test func unknownRouteIs404WithTheErrorShape() async throws {
        try await withServer(standardRouter()) { _, port in
            let response = try await onThread { try RawHTTPClient(port: port).request("GET", "/nope/secret-token") }
            #expect(response.status == 404)
            #expect(response.text == #"{"error":{"code":"not_found","message":"no such resource"}}"#)
        }
    }

    /// A HEAD health check gets what GET would, without the body, and the connection carries on.
    @Test func headIsAGetWithoutTheBody() async throws {
        try await withServer(standardRouter()) { _, port in
            let (head, next) = try await onThread {
                let client = try RawHTTPClient(port: port)
                try client.send("HEAD /v1/apps/a/echo HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                let head = try client.read(until: "\r\n\r\n")
                return (head, try client.request("GET", "/v1/apps/b/echo"))
            }
            #expect(head.hasPrefix("HTTP/1.1 200 "), "\(head)")
            #expect(head.lowercased().contains("content-length: ") && !head.lowercased().contains("content-length: 0\r"))
            #expect(next.status == 200, "no body bytes were left before the next answer")
            #expect(try JSONDecoder().decode(Echo.self, from: Data(next.body)).appID == "b")
        }
    }

    @Test func knownPathWithAnotherMethodIs405WithAllow() async throws {
        try await withServer(standardRouter()) { _, port in
            let response = try await onThread {
                try RawHTTPClient(port: port).request("DELETE", "/v1/apps/a/subscriptions")
            }
            #expect(response.status == 405)
            #expect(response.headers["allow"] == "POST")
            #expect(try response.json()["error"].flatMap { ($0 as? [String: Any])?["code"] as? String }
                == "method_not_allowed")
        }
    }

    // MARK: Bodies

    @Test func declaredBodyOverTheLimitIs413WithoutReadingIt() async throws {
        try await withServer(standardRouter(), configure: { $0.maxBodyBytes = 1024 }) { _, port in
            let (response, closed) = try await onThread {
                let client = try RawHTTPClient(port: port)
                // Headers only: the server must answer without waiting for the 100 000 bytes announced.
                try client.send("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
                let response = try client.readResponse()
                return (response, client.isClosedByServer())
            }
            #expect(response.status == 413)
            #expect(response.text.contains(#""code":"body_too_large""#))
            #expect(closed)
        }
    }

    @Test func chunkedBodyGrowingOverTheLimitIs413() async throws {
        try await withServer(standardRouter(), configure: { $0.maxBodyBytes = 1024 }) { _, port in
            let (tooLarge, next) = try await onThread {
                let client = try RawHTTPClient(port: port)
                try client.send("POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                let chunk = String(repeating: "a", count: 512)
                for _ in 0..<4 { try client.send("200\r\n\(chunk)\r\n") }
                try client.send("0\r\n\r\n")
                let tooLarge = try client.readResponse()
                // The connection stays in step: the next request on it is answered normally.
                let next = try client.request("POST", "/upload", body: "small")
                return (tooLarge, next)
            }
            #expect(tooLarge.status == 413)
            #expect(tooLarge.text.contains(#""code":"body_too_large""#))
            #expect(next.status == 201)
            #expect(next.text == "got 5")
        }
    }

    @Test func chunkedBodyWithinTheLimitIsAssembled() async throws {
        try await withServer(standardRouter(), configure: { $0.maxBodyBytes = 1024 }) { _, port in
            let response = try await onThread {
                let client = try RawHTTPClient(port: port)
                try client.send("POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                for _ in 0..<4 { try client.send("100\r\n\(String(repeating: "b", count: 256))\r\n") }
                try client.send("0\r\n\r\n")
                return try client.readResponse()
            }
            #expect(response.status == 201)
            #expect(response.text == "got 1024")
        }
    }

    /// Well-formed trailer fields are read and dropped; the request is answered as without them.
    @Test func chunkedBodyWithTrailerFieldsIsAccepted() async throws {
        try await withServer(standardRouter(), configure: { $0.maxBodyBytes = 1024 }) { _, port in
            let response = try await onThread {
                let client = try RawHTTPClient(port: port)
                try client.send("POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n")
                try client.send("X-Checksum: 1234\r\nX-Empty:\r\nX-Tab:\ta\tb\r\n\r\n")
                return try client.readResponse()
            }
            #expect(response.status == 201)
            #expect(response.text == "got 4")
        }
    }

    @Test func jsonRoutesRequireAJSONContentType() async throws {
        try await withServer(standardRouter()) { _, port in
            let (plain, missing, withCharset) = try await onThread {
                let client = try RawHTTPClient(port: port)
                let body = #"{"channel":"news","count":2}"#
                let plain = try client.request("POST", "/v1/apps/a/subscriptions",
                                               headers: ["Content-Type": "text/plain"], body: body)
                let missing = try client.request("POST", "/v1/apps/a/subscriptions", body: body)
                let withCharset = try client.request("POST", "/v1/apps/a/subscriptions",
                                                     headers: ["Content-Type": "application/json; charset=UTF-8"],
                                                     body: body)
                return (plain, missing, withCharset)
            }
            #expect(plain.status == 415)
            #expect(plain.text.contains(#""code":"unsupported_media_type""#))
            #expect(missing.status == 415)
            #expect(withCharset.status == 201)
            #expect(try withCharset.json() as? [String: String] == ["app": "a", "channel": "news", "count": "2"])
        }
    }

    @Test func invalidJSONNamesTheField() async throws {
        try await withServer(standardRouter()) { _, port in
            let response = try await onThread {
                try RawHTTPClient(port: port).request("POST", "/v1/apps/a/subscriptions",
                                                      headers: ["Content-Type": "application/json"],
                                                      body: #"{"count":2}"#)
            }
            #expect(response.status == 400)
            #expect(response.text
                == #"{"error":{"code":"invalid_json","message":"missing field \"channel\"","field":"channel"}}"#)
        }
    }

    @Test func otherErrorsBecome500WithoutInternals() async throws {
        try await withServer(standardRouter()) { _, port in
            let response = try await onThread { try RawHTTPClient(port: port).request("GET", "/boom") }
            #expect(response.status == 500)
            #expect(response.text.contains(#""code":"internal_error""#))
            #expect(!response.text.contains("secret"))
        }
    }

    // MARK: Request ids

    @Test func requestIDIsEchoedOrGenerated() async throws {
        try await withServer(standardRouter()) { _, port in
            let (kept, replaced, fresh) = try await onThread {
                let client = try RawHTTPClient(port: port)
                let kept = try client.request("GET", "/v1/apps/a/echo", headers: ["X-Request-ID": "req-42"])
                let replaced = try client.request("GET", "/v1/apps/a/echo",
                                                  headers: ["X-Request-ID": String(repeating: "x", count: 200)])
                let fresh = try client.request("GET", "/nope")
                return (kept, replaced, fresh)
            }
            #expect(kept.headers["x-request-id"] == "req-42")
            let generated = try #require(replaced.headers["x-request-id"])
            #expect(generated.count == 32 && generated.allSatisfy(\.isHexDigit))
            #expect(fresh.headers["x-request-id"]?.count == 32)
            #expect(fresh.headers["x-request-id"] != generated)
        }
    }

    // MARK: Connections

    @Test func keepAliveServesSeveralRequestsOnOneConnection() async throws {
        try await withServer(standardRouter()) { _, port in
            let statuses = try await onThread {
                let client = try RawHTTPClient(port: port)
                var statuses: [Int] = []
                for index in 0..<6 {
                    let response = index.isMultiple(of: 2)
                        ? try client.request("GET", "/v1/apps/a\(index)/echo")
                        : try client.request("POST", "/v1/apps/a/subscriptions",
                                             headers: ["Content-Type": "application/json"],
                                             body: #"{"channel":"c\#(index)","count":\#(index)}"#)
                    #expect(response.headers["connection"]?.lowercased() != "close")
                    statuses.append(response.status)
                }
                return statuses
            }
            #expect(statuses == [200, 201, 200, 201, 200, 201])
        }
    }

    @Test func concurrentClientsGetTheirOwnAnswers() async throws {
        try await withServer(standardRouter()) { _, port in
            try await withThrowingTaskGroup(of: Int.self) { group in
                for clientIndex in 0..<16 {
                    group.addTask {
                        try await onThread {
                            let client = try RawHTTPClient(port: port)
                            var matched = 0
                            for requestIndex in 0..<25 {
                                let channel = "c\(clientIndex)-\(requestIndex)"
                                let response = try client.request(
                                    "POST", "/v1/apps/app\(clientIndex)/subscriptions",
                                    headers: ["Content-Type": "application/json"],
                                    body: #"{"channel":"\#(channel)","count":\#(requestIndex)}"#)
                                let object = try response.json() as? [String: String]
                                if response.status == 201, object?["channel"] == channel,
                                   object?["app"] == "app\(clientIndex)" {
                                    matched += 1
                                }
                            }
                            return matched
                        }
                    }
                }
                var total = 0
                for try await matched in group { total += matched }
                #expect(total == 16 * 25)
            }
        }
    }

    @Test func clientLeavingMidHandlerLeavesTheServerHealthy() async throws {
        let finished = Atomic<Int>(0)
        var router = standardRouter()
        router.get("/slow") { _ in
            try? await Task.sleep(for: .milliseconds(300))
            finished.add(1, ordering: .relaxed)
            return .text("late")
        }
        try await withServer(router) { server, port in
            try await onThread {
                for _ in 0..<5 {
                    let client = try RawHTTPClient(port: port)
                    try client.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
                }  // each client is closed as it goes out of scope, before its handler answers
            }
            try await waitFor { finished.load(ordering: .relaxed) == 5 }
            // Every abandoned request is released once its answer fails to go out.
            try await waitFor { server.inFlightRequests == 0 }
            let response = try await onThread { try RawHTTPClient(port: port).request("GET", "/v1/apps/a/echo") }
            #expect(response.status == 200)
        }
    }

    // MARK: Deadlines and shutdown

    @Test func handlerPastTheRequestDeadlineIs503AndCancelled() async throws {
        let cancelled = Atomic<Bool>(false)
        var router = Router()
        router.get("/stuck") { _ in
            do { try await Task.sleep(for: .seconds(30)) } catch { cancelled.store(true, ordering: .relaxed) }
            return .text("too late")
        }
        try await withServer(router, configure: { $0.requestDeadline = .milliseconds(200) }) { _, port in
            let started = ContinuousClock.now
            let response = try await onThread { try RawHTTPClient(port: port).request("GET", "/stuck") }
            #expect(response.status == 503)
            #expect(response.text.contains(#""code":"unavailable""#))
            #expect(ContinuousClock.now - started < .seconds(2))
            try await waitFor { cancelled.load(ordering: .relaxed) }
        }
    }

    @Test func shutdownFinishesInFlightRequestsAndRefusesNewConnections() async throws {
        let started = Atomic<Bool>(false)
        var router = Router()
        router.get("/slow") { _ in
            started.store(true, ordering: .relaxed)
            try? await Task.sleep(for: .milliseconds(600))
            return .text("finished")
        }
        let server = try HTTPServer(configuration: HTTPServerConfiguration(address: HostPort(host: "127.0.0.1", port: 0)),
                                    router: router, logger: Self.logger, metrics: MetricsRegistry())
        let port = server.localAddress.port
        let running = Task { try await server.run() }

        let inFlight = Task { try await onThread { try RawHTTPClient(port: port).request("GET", "/slow") } }
        try await waitFor { started.load(ordering: .relaxed) }
        running.cancel()
        try await waitFor { (try? RawHTTPClient(port: port)) == nil }  // quiesced: connect is refused

        let response = try await inFlight.value
        #expect(response.status == 200)
        #expect(response.text == "finished")
        #expect(response.headers["connection"]?.lowercased() == "close")
        try await running.value
        #expect((try? RawHTTPClient(port: port)) == nil)
    }

    @Test func shutdownAnswers503WhenTheGracePeriodRunsOut() async throws {
        let started = Atomic<Bool>(false)
        var router = Router()
        router.get("/forever") { _ in
            started.store(true, ordering: .relaxed)
            try? await Task.sleep(for: .seconds(30))
            return .text("never")
        }
        let configuration = HTTPServerConfiguration(address: HostPort(host: "127.0.0.1", port: 0),
                                                    shutdownGracePeriod: .milliseconds(200))
        let server = try HTTPServer(configuration: configuration, router: router, logger: Self.logger,
                                    metrics: MetricsRegistry())
        let port = server.localAddress.port
        let running = Task { try await server.run() }
        let inFlight = Task { try await onThread { try RawHTTPClient(port: port).request("GET", "/forever") } }
        try await waitFor { started.load(ordering: .relaxed) }
        let stopping = ContinuousClock.now
        running.cancel()
        let response = try await inFlight.value
        try await running.value
        #expect(response.status == 503)
        #expect(ContinuousClock.now - stopping < .seconds(3))
    }

    // MARK: Metrics

    @Test func metricsCountRequestsByRoutePatternNotRawPath() async throws {
        let metrics = MetricsRegistry()
        var router = standardRouter()
        router.addMetrics(registry: metrics)
        try await withServer(router, metrics: metrics) { _, port in
            let exposition = try await onThread {
                let client = try RawHTTPClient(port: port)
                _ = try client.request("POST", "/v1/apps/secret-app/subscriptions",
                                       headers: ["Content-Type": "application/json"],
                                       body: #"{"channel":"a","count":1}"#)
                _ = try client.request("GET", "/not/a/route")
                return try client.request("GET", "/metrics")
            }
            #expect(exposition.status == 200)
            #expect(exposition.headers["content-type"]?.hasPrefix("text/plain; version=0.0.4") == true)
            let text = exposition.text
            #expect(text.contains(#"herald_http_requests_total{route="/v1/apps/{appID}/subscriptions",method="POST",status="201"} 1"#))
            #expect(text.contains(#"herald_http_requests_total{route="unmatched",method="GET",status="404"} 1"#))
            #expect(text.contains(#"herald_http_request_duration_seconds_count{route="/v1/apps/{appID}/subscriptions"} 1"#))
            #expect(!text.contains("secret-app"))
        }
    }

    /// Each loop keeps the series it has seen (`WorkerLoop.series`): repeated requests, from several connections
    /// (spread over the loops), still add up in the one exposed series per route, method and status.
    @Test func metricsAddUpAcrossRequestsConnectionsAndLoops() async throws {
        let metrics = MetricsRegistry()
        var router = standardRouter()
        router.addMetrics(registry: metrics)
        try await withServer(router, metrics: metrics) { _, port in
            let exposition = try await onThread {
                for _ in 0..<4 {
                    let client = try RawHTTPClient(port: port)
                    for _ in 0..<3 {
                        _ = try client.request("POST", "/v1/apps/a/subscriptions",
                                               headers: ["Content-Type": "application/json"],
                                               body: #"{"channel":"a","count":1}"#)
                    }
                    _ = try client.request("GET", "/v1/apps/a/subscriptions")
                }
                // A request is counted once its answer is written, so its client can read the answer first.
                let deadline = ContinuousClock.now + .seconds(5)
                var text = ""
                repeat {
                    text = try RawHTTPClient(port: port).request("GET", "/metrics").text
                } while !text.contains(#"herald_http_request_duration_seconds_count{route="/v1/apps/{appID}/subscriptions"} 16"#)
                    && ContinuousClock.now < deadline
                return text
            }
            let text = exposition
            #expect(text.contains(#"herald_http_requests_total{route="/v1/apps/{appID}/subscriptions",method="POST",status="201"} 12"#))
            #expect(text.contains(#"herald_http_requests_total{route="/v1/apps/{appID}/subscriptions",method="GET",status="405"} 4"#))
            #expect(text.contains(#"herald_http_request_duration_seconds_count{route="/v1/apps/{appID}/subscriptions"} 16"#))
        }
    }

    @Test func aTakenPortFailsAtInit() throws {
        let first = try HTTPServer(configuration: HTTPServerConfiguration(address: HostPort(host: "127.0.0.1", port: 0)),
                                   router: Router(), logger: Self.logger, metrics: MetricsRegistry())
        #expect(throws: HTTPServerError.self) {
            _ = try HTTPServer(configuration: HTTPServerConfiguration(address: first.localAddress),
                               router: Router(), logger: Self.logger, metrics: MetricsRegistry())
        }
    }
}

/// Polls `condition` every 10 ms for up to 5 s.
func waitFor(_ condition: () -> Bool, sourceLocation: SourceLocation = #_sourceLocation) async throws {
    let deadline = ContinuousClock.now + .seconds(5)
    while !condition() {
        guard ContinuousClock.now < deadline else {
            Issue.record("condition not met within 5 s", sourceLocation: sourceLocation)
            return
        }
        try await Task.sleep(for: .milliseconds(10))
    }
}

/// The per-address connection limit counts an IPv6 client by its network, and an IPv4 client the same however a
/// dual-stack listener writes its address.
@Suite("Connections per client address")
struct AddressCounterTests {
    @Test func ipv6ClientsCountPerNetworkAndMappedIPv4AsIPv4() {
        #expect(AddressCounter.client("2001:db8:1:2:aaaa:bbbb:cccc:dddd", ipv6PrefixLength: 64) == "2001:db8:1:2::/64")
        #expect(AddressCounter.client("2001:db8:1:2:aaaa::1", ipv6PrefixLength: 56) == "2001:db8:1::/56")
        #expect(AddressCounter.client("2001:db8::1", ipv6PrefixLength: 128) == "2001:db8::1/128")
        #expect(AddressCounter.client("::ffff:10.1.2.3", ipv6PrefixLength: 64) == "10.1.2.3")
        #expect(AddressCounter.client("10.1.2.3", ipv6PrefixLength: 64) == "10.1.2.3")

        let counter = AddressCounter(limit: 2, ipv6PrefixLength: 64)
        #expect(counter.admit("2001:db8::1") && counter.admit("2001:db8::ffff:2"))
        #expect(!counter.admit("2001:db8::1:0:0:3"), "a third address of the same /64 is the same client")
        #expect(counter.admit("2001:db8:0:1::1"), "another /64 is another client")
        #expect(counter.admit("::ffff:10.0.0.1") && counter.admit("10.0.0.1"))
        #expect(!counter.admit("10.0.0.1"))
        counter.release("::ffff:10.0.0.1")
        #expect(counter.admit("10.0.0.1"))
        counter.release("2001:db8::ffff:2")
        #expect(counter.admit("2001:db8::5"), "a connection of the network closed")
    }
}
