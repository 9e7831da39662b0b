import Foundation
import HeraldCrypto
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldTestSupport
import Synchronization
import Testing

/// herald-ingest as a process on a free port, against the test Redis and broker, with a fresh apps file and jobs
/// topic. `extra` sets further `HERALD_*` variables (the HTTP limits under test).
final class ReliabilityIngest: Sendable {
    let apps: TestApps
    let child: ChildProcess
    let port: UInt16
    let topic: String
    let directory: String

    init(apps: TestApps? = nil, extra: [String: String] = [:]) async throws {
        let apps = try apps ?? TestApps()
        self.apps = apps
        directory = try scratchDirectory("herald-reliability-")
        topic = "herald.jobs.rel-" + SecureRandom.hex(6)
        let brokers = try TestEnvironment.kafkaBrokers()
        let admin = try KafkaAdmin(configuration: KafkaConfiguration(brokerList: brokers),
                                   logger: Logger(label: "test", minimumLevel: .warning))
        try await admin.createTopic(topic, partitions: 2)
        admin.close()
        port = try freePort()
        child = try ChildProcess("herald-ingest", executable: try builtExecutable("herald-ingest"), environment: [
            "HERALD_INGEST_ADDR": "127.0.0.1:\(port)",
            "HERALD_APPS_FILE": apps.path, "HERALD_JOB_SIGNING_SECRET_FILE": apps.jobSigningSecretPath,
            "HERALD_REDIS_URL": try TestEnvironment.redisURL(),
            "HERALD_KAFKA_BROKERS": brokers,
            "HERALD_TOPIC_JOBS": topic,
            "HERALD_RATE_LIMIT_PER_MINUTE": "1000000",
            "HERALD_LOG_LEVEL": "info",
        ].merging(extra) { _, new in new }, logPath: directory + "/ingest.log")
        // From an address no attack uses: the server may count this connection a moment after it closed.
        try await eventually("herald-ingest is ready") {
            (try? await self.request("GET", "/readyz", from: "127.0.0.3"))?.status == 200
        }
    }

    /// One request on a fresh connection from `source` (any 127.0.0.0/8 address).
    func request(_ method: String, _ path: String, headers: [String: String] = [:], json body: String? = nil,
                 from source: String = "127.0.0.1") async throws -> TestSocket.Response {
        var all = headers
        if body != nil { all["Content-Type"] = "application/json" }
        let port = self.port, finalHeaders = all
        return try await onThread {
            let socket = try TestSocket(port: port, source: source, timeout: 5)
            var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            for (name, value) in finalHeaders { head += "\(name): \(value)\r\n" }
            if let body { head += "Content-Length: \(body.utf8.count)\r\n" }
            try socket.send(Array((head + "\r\n" + (body ?? "")).utf8))
            return try socket.readResponse()
        }
    }

    /// Stops the process; removes its folder and apps file unless the test failed (they are evidence then).
    func stop(keepFiles: Bool = false) async {
        await child.stop()
        if !keepFiles {
            apps.remove()
            try? FileManager.default.removeItem(atPath: directory)
        }
    }
}

/// A client socket bound to a chosen loopback source address (so tests can be many "clients" by IP), sending raw
/// bytes and watching for the server's answer or close. Every blocking call has a timeout.
final class TestSocket: @unchecked Sendable { // used by one thread at a time (the attack or probe owning it)
    struct Failure: Error, CustomStringConvertible { var description: String }

    /// One parsed response.
    struct Response: Sendable {
        var status: Int
        /// Lower-cased names.
        var headers: [String: String]
        var body: [UInt8]
        var text: String { String(decoding: body, as: UTF8.self) }
        func json() throws -> [String: Any] {
            guard let object = try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else {
                throw Failure(description: "not a JSON object: \(text)")
            }
            return object
        }
    }

    let fd: Int32
    let opened = ContinuousClock.now
    private var buffer: [UInt8] = []

    init(port: UInt16, source: String = "127.0.0.1", timeout: Int = 5) throws {
        // `self.fd` is set only once connected, so a failed init does not close it twice (see RawHTTPClient).
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw Failure(description: "socket: \(String(cString: strerror(errno)))") }
        var time = timeval(tv_sec: timeout, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &time, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &time, socklen_t(MemoryLayout<timeval>.size))
        var local = sockaddr_in()
        local.sin_family = sa_family_t(AF_INET)
        local.sin_addr.s_addr = inet_addr(source)
        var remote = local
        remote.sin_addr.s_addr = inet_addr("127.0.0.1")
        remote.sin_port = port.bigEndian
        let bound = withUnsafePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        let connected = bound == 0 ? withUnsafePointer(to: &remote) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        } : -1
        guard connected == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw Failure(description: "connect from \(source): \(reason)")
        }
        self.fd = fd
    }

    deinit { close(fd) }

    /// Sends everything; false when the server has closed or reset the connection.
    @discardableResult
    func send(_ bytes: [UInt8]) throws -> Bool {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { Foundation.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if written < 0 {
                if errno == EPIPE || errno == ECONNRESET { return false }
                throw Failure(description: "send: \(String(cString: strerror(errno)))")
            }
            offset += written
        }
        return true
    }

    func send(_ text: String) throws { try send(Array(text.utf8)) }

    /// Reads for up to `timeout`: what arrived and whether the server closed the connection in that time.
    func readUntilClosed(timeout: Duration) -> (bytes: [UInt8], closed: Bool) {
        let end = ContinuousClock.now + timeout
        while ContinuousClock.now < end {
            switch poll(until: end) {
            case .closed: return (buffer, true)
            case .data, .nothing: continue
            }
        }
        return (buffer, false)
    }

    /// True when the server closed the connection (EOF or reset) within `timeout`, without reading past it.
    func isClosed(within timeout: Duration) -> Bool { readUntilClosed(timeout: timeout).closed }

    /// Everything received so far, as text.
    var received: String { String(decoding: buffer, as: UTF8.self) }

    /// The status codes of the responses received so far, in order.
    var statuses: [Int] {
        received.components(separatedBy: "HTTP/1.1 ").dropFirst().compactMap { Int($0.prefix(3)) }
    }

    enum Poll { case data, closed, nothing }

    /// Waits for input until `end` (at most 100 ms per call).
    func poll(until end: ContinuousClock.Instant) -> Poll {
        let left = end - ContinuousClock.now
        let millis = max(0, min(100, Int32(left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000)))
        var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard Glibc.poll(&descriptor, 1, millis) > 0 else { return .nothing }
        var chunk = [UInt8](repeating: 0, count: 65_536)
        let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
        if count > 0 {
            buffer.append(contentsOf: chunk[..<count])
            return .data
        }
        if count == 0 || errno == ECONNRESET { return .closed }
        return .nothing
    }

    /// Reads one response framed by Content-Length (what Herald and libmicrohttpd send).
    func readResponse(timeout: Duration = .seconds(5)) throws -> TestSocket.Response {
        let end = ContinuousClock.now + timeout
        while ContinuousClock.now < end {
            if let response = takeResponse() { return response }
            if case .closed = poll(until: end), takeResponse() == nil {
                throw Failure(description: "closed before a whole response: \(received)")
            }
        }
        throw Failure(description: "no response within \(timeout): \(received)")
    }

    private func takeResponse() -> TestSocket.Response? {
        let marker = Array("\r\n\r\n".utf8)
        guard buffer.count >= 4,
              let headEnd = (0...(buffer.count - 4)).first(where: { buffer[$0..<$0 + 4].elementsEqual(marker) }) else {
            return nil
        }
        let head = String(decoding: buffer[..<headEnd], as: UTF8.self)
        var lines = head.components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst().split(separator: " ")
        guard statusLine.count >= 2, let status = Int(statusLine[1]) else { return nil }
        var headers: [String: String] = [:]
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        let length = headers["content-length"].flatMap(Int.init) ?? 0
        guard buffer.count >= headEnd + 4 + length else { return nil }
        let body = Array(buffer[(headEnd + 4)..<(headEnd + 4 + length)])
        buffer.removeFirst(headEnd + 4 + length)
        return TestSocket.Response(status: status, headers: headers, body: body)
    }
}

/// A well-behaved client sending one real API request (a subscriptions lookup: key check, rate limit and Redis)
/// every 50 ms on a fresh connection from its own address, recording each latency and any failure.
final class GoodClient: Sendable {
    struct Sample: Sendable {
        var latency: Duration
        var status: Int?
        var error: String?
    }

    private let samples = Lock<[Sample]>([])
    private let running = Atomic<Bool>(true)
    private let done = DispatchSemaphore(value: 0)

    init(ingest: ReliabilityIngest, source: String = "127.0.0.2") {
        let port = ingest.port
        let app = ingest.apps.apps[0]
        let request = "GET /v1/apps/\(app.id)/subscriptions?deviceToken=\(SecureRandom.hex(32)) HTTP/1.1\r\n"
            + "Host: 127.0.0.1\r\nX-API-Key: \(app.publicKey)\r\n\r\n"
        let thread = Thread { [self] in
            while running.load(ordering: .relaxed) {
                let started = ContinuousClock.now
                var sample = Sample(latency: .zero)
                do {
                    let socket = try TestSocket(port: port, source: source, timeout: 30)
                    try socket.send(request)
                    sample.status = try socket.readResponse(timeout: .seconds(30)).status
                } catch {
                    sample.error = "\(error)"
                }
                sample.latency = ContinuousClock.now - started
                samples.withLock { $0.append(sample) }
                Thread.sleep(forTimeInterval: 0.05)
            }
            done.signal()
        }
        thread.start()
    }

    /// Stops after the request in progress and returns every sample.
    func finish() async -> [Sample] {
        running.store(false, ordering: .relaxed)
        let done = self.done
        _ = try? await onThread { done.wait() }
        return samples.withLock { $0 }
    }
}

/// Latency figures of a run of good-client samples, for assertions and RELIABILITY.md.
struct LatencySummary: CustomStringConvertible {
    let count: Int
    let failures: [String]
    let median: Duration
    let max: Duration

    init(_ samples: [GoodClient.Sample]) {
        count = samples.count
        failures = samples.compactMap { sample in
            if let error = sample.error { return error }
            return sample.status == 200 ? nil : "status \(sample.status ?? 0)"
        }
        let sorted = samples.map(\.latency).sorted()
        median = sorted.isEmpty ? .zero : sorted[sorted.count / 2]
        max = sorted.last ?? .zero
    }

    var description: String { "good client: \(count) requests, \(failures.count) failed, median \(median.ms) ms, max \(max.ms) ms" }
}

extension Duration {
    /// Whole milliseconds, for messages.
    var ms: Int64 { components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000 }
}

/// Runs `attack` while a `GoodClient` is served from another address; checks the good client got only 200s, none
/// slower than `bound`, and records the figures (printed for RELIABILITY.md).
func duringAttack<T: Sendable>(_ name: String, on ingest: ReliabilityIngest, goodClientBound bound: Duration = .seconds(2),
                               _ attack: @escaping @Sendable () throws -> T) async throws -> T {
    let good = GoodClient(ingest: ingest)
    let result = try await onThread(attack)
    let summary = LatencySummary(await good.finish())
    print("[hostile] \(name): \(summary)")
    #expect(summary.count >= 3, "\(name): the good client made too few requests")
    #expect(summary.failures.isEmpty, "\(name): \(summary.failures.prefix(3))")
    #expect(summary.max < bound, "\(name): \(summary)")
    return result
}

/// Every key and its `DUMP` under `pattern` (SCAN, so it is safe on a shared Redis).
func redisSnapshot(_ redis: RedisClient, pattern: String) async throws -> [String: [UInt8]] {
    var snapshot: [String: [UInt8]] = [:]
    var cursor = "0"
    repeat {
        let reply = try await redis.command(["SCAN", cursor, "MATCH", pattern, "COUNT", "1000"])
        guard case .array(let parts) = reply, parts.count == 2, let next = parts[0].string,
              case .array(let keys) = parts[1] else { throw TestSocket.Failure(description: "bad SCAN reply \(reply)") }
        cursor = next
        for key in keys.compactMap(\.string) {
            snapshot[key] = try await redis.command(["DUMP", key]).bytes ?? []
        }
    } while cursor != "0"
    return snapshot
}
