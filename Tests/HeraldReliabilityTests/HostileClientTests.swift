import Foundation
import HeraldCrypto
import HeraldTestSupport
import Testing

/// Hostile clients against herald-ingest as a process: each attack must be answered (4xx/5xx) or closed within the
/// configured limits while a well-behaved client on another address keeps getting 200s quickly.
///
/// Limits are set low so the suite is fast: idle timeout 2 s, read timeout 3 s, 48 connections, 12 per address.
@Suite(.serialized) struct HostileClientTests {
    static let idle = Duration.seconds(2)
    static let read = Duration.seconds(3)
    static let maxConnections = 48
    static let perAddress = 12
    /// How late past a limit a close may come on this loaded box (sweep every 100 ms, 1 s idle granularity).
    static let slack = Duration.milliseconds(1500)

    static func start() async throws -> ReliabilityIngest {
        try await ReliabilityIngest(extra: [
            "HERALD_HTTP_IDLE_TIMEOUT_SECONDS": "\(idle.components.seconds)",
            "HERALD_HTTP_READ_TIMEOUT_SECONDS": "\(read.components.seconds)",
            "HERALD_HTTP_MAX_CONNECTIONS": "\(maxConnections)",
            "HERALD_HTTP_MAX_CONNECTIONS_PER_IP": "\(perAddress)",
        ])
    }

    /// A request line and headers for an endpoint with a JSON body, without the blank line.
    static func postHead(_ ingest: ReliabilityIngest, extra: String = "") -> String {
        let app = ingest.apps.apps[0]
        return "POST /v1/apps/\(app.id)/subscriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: \(app.publicKey)\r\n"
            + "Content-Type: application/json\r\n" + extra
    }

    // MARK: Slow loris

    @Test func headersTrickledByteByByteAreCutAtTheReadTimeout() async throws {
        let ingest = try await Self.start()
        let head = Array((Self.postHead(ingest) + "X-Padding: " + String(repeating: "p", count: 4000)).utf8)
        let port = ingest.port
        // Eight connections, each sending one byte every 250 ms: never idle, never finished.
        let lifetimes = try await duringAttack("slow-loris headers", on: ingest) {
            try Self.trickle(head, connections: 8, port: port, every: .milliseconds(250))
        }
        print("[hostile] slow-loris headers: closed after \(lifetimes.map(\.ms)) ms")
        for lifetime in lifetimes {
            #expect(lifetime >= Self.read - .milliseconds(200), "closed before the read timeout: the idle timeout should not fire on a trickle")
            #expect(lifetime < Self.read + Self.slack)
        }
        await ingest.stop()
    }

    @Test func bodyTrickledByteByByteIsCutAtTheReadTimeout() async throws {
        let ingest = try await Self.start()
        let body = "{\"channel\": \"c\", \"tokenType\": \"alert\", \"deviceToken\": \"\(SecureRandom.hex(32))\"}"
            + String(repeating: " ", count: 2000)
        let request = Array((Self.postHead(ingest, extra: "Content-Length: \(body.utf8.count)\r\n") + "\r\n" + body).utf8)
        let headLength = request.count - body.utf8.count
        let port = ingest.port
        let lifetimes = try await duringAttack("slow-loris body", on: ingest) {
            try Self.trickle(request, connections: 8, port: port, every: .milliseconds(250), burst: headLength)
        }
        print("[hostile] slow-loris body: closed after \(lifetimes.map(\.ms)) ms")
        for lifetime in lifetimes {
            #expect(lifetime >= Self.read - .milliseconds(200))
            #expect(lifetime < Self.read + Self.slack)
        }
        await ingest.stop()
    }

    /// Opens `connections` sockets, sends the first `burst` bytes at once, then one byte per `every` on each until
    /// the server closes it; returns how long each connection lived. Fails if one outlives twice the read timeout.
    static func trickle(_ bytes: [UInt8], connections: Int, port: UInt16, every interval: Duration,
                        burst: Int = 0) throws -> [Duration] {
        let sockets = try (0..<connections).map { _ in try TestSocket(port: port) }
        var lifetimes = [Duration?](repeating: nil, count: connections)
        var sent = burst
        for socket in sockets where burst > 0 { try socket.send(Array(bytes[..<burst])) }
        let giveUp = ContinuousClock.now + read * 2 + slack
        while lifetimes.contains(where: { $0 == nil }), ContinuousClock.now < giveUp {
            let next = ContinuousClock.now + interval
            for (index, socket) in sockets.enumerated() where lifetimes[index] == nil {
                let alive = sent < bytes.count ? try socket.send([bytes[sent]]) : true
                if !alive || socket.poll(until: .now) == .closed { lifetimes[index] = ContinuousClock.now - socket.opened }
            }
            sent += 1
            while ContinuousClock.now < next {
                for (index, socket) in sockets.enumerated() where lifetimes[index] == nil {
                    if socket.poll(until: next) == .closed { lifetimes[index] = ContinuousClock.now - socket.opened }
                }
            }
        }
        #expect(sent < bytes.count, "the trickle ran out of bytes before the server closed")
        let unclosed = lifetimes.filter { $0 == nil }.count
        #expect(unclosed == 0, "\(unclosed) trickling connections still open after \(read * 2 + slack)")
        return lifetimes.compactMap { $0 }
    }

    // MARK: Huge headers

    @Test func oneHugeHeaderOrVeryManyHeadersGet431() async throws {
        let ingest = try await Self.start()
        let port = ingest.port
        let app = ingest.apps.apps[0]
        let requests = [
            "one 64 KiB header": "GET /v1/apps/\(app.id)/subscriptions HTTP/1.1\r\nHost: a\r\nX-Big: "
                + String(repeating: "a", count: 65_536) + "\r\n\r\n",
            "5000 headers": "GET /v1/apps/\(app.id)/subscriptions HTTP/1.1\r\nHost: a\r\n"
                + (0..<5000).map { "X-H\($0): v\r\n" }.joined() + "\r\n",
        ]
        let answers = try await duringAttack("huge headers", on: ingest) {
            try requests.mapValues { text -> (Int, Duration) in
                var status = 0
                var rounds = 0
                let started = ContinuousClock.now
                while ContinuousClock.now - started < .seconds(1) { // repeated, so the good client runs alongside
                    let socket = try TestSocket(port: port)
                    _ = try socket.send(text)
                    let (_, closed) = socket.readUntilClosed(timeout: .seconds(5))
                    #expect(closed)
                    status = socket.statuses.first ?? 0
                    rounds += 1
                }
                return (status, (ContinuousClock.now - started) / rounds)
            }
        }
        for (name, (status, time)) in answers {
            print("[hostile] \(name): \(status) and closed in \(time.ms) ms")
            #expect(status == 431, "\(name)")
            #expect(time < .seconds(1), "\(name)")
        }
        await ingest.stop()
    }

    // MARK: Many connections

    @Test func connectionsOverThePerAddressLimitAreClosedAtOnce() async throws {
        let ingest = try await Self.start()
        let port = ingest.port
        let (kept, closedFast) = try await duringAttack("40 connections from one address", on: ingest) {
            let sockets = try (0..<40).map { _ in try TestSocket(port: port) }
            let started = ContinuousClock.now
            // Over the limit: closed within 500 ms (the idle timeout is 2 s, the read timeout 3 s).
            Thread.sleep(forTimeInterval: 0.5)
            let held = sockets.filter { $0.poll(until: .now) != .closed }
            // The held ones stay until the idle timeout.
            var late = 0
            for socket in held where !socket.isClosed(within: Self.read + Self.slack - (ContinuousClock.now - started)) {
                late += 1
            }
            #expect(late == 0, "\(late) idle connections outlived the read timeout")
            return (held.count, sockets.count - held.count)
        }
        print("[hostile] 40 connections from one address: \(kept) held, \(closedFast) closed at once")
        #expect(kept == Self.perAddress)
        await ingest.stop()
    }

    @Test func connectionsOverTheTotalLimitWaitAndTheServerRecovers() async throws {
        let ingest = try await Self.start()
        let port = ingest.port
        // 64 idle connections from 8 addresses (8 each, under the per-address limit): 16 more than the total.
        let sockets = try (0..<64).map { index in try TestSocket(port: port, source: "127.0.1.\(index % 8 + 1)") }
        let attackStarted = ContinuousClock.now
        // Meanwhile a good client: its connection waits in the accept queue until the read timeout frees slots.
        let good = GoodClient(ingest: ingest)
        let closedAll = try await onThread {
            sockets.allSatisfy { $0.isClosed(within: Self.read * 2 + Self.slack * 2 - (ContinuousClock.now - attackStarted)) }
        }
        let allClosed = ContinuousClock.now - attackStarted
        try await Task.sleep(for: .seconds(1))
        let samples = await good.finish()
        let summary = LatencySummary(samples)
        print("[hostile] 64 idle connections over a limit of 48: all closed after \(allClosed.ms) ms; \(summary)")
        #expect(closedAll, "idle connections outlived twice the read timeout")
        #expect(summary.failures.isEmpty, "\(summary.failures.prefix(3))")
        // The first request waited at most one read timeout for a slot; the later ones were quick.
        #expect(summary.max < Self.read + Self.slack)
        #expect(samples.suffix(5).allSatisfy { $0.latency < .seconds(1) })
        await ingest.stop()
    }

    // MARK: Garbage

    @Test func pipelinedGarbageIsAnsweredOrClosed() async throws {
        let ingest = try await Self.start()
        let port = ingest.port
        var binary = [UInt8](repeating: 0, count: 4096)
        for index in binary.indices { binary[index] = UInt8.random(in: 0...255) }
        // (name, bytes, the answers allowed (none: closed without one, there is no request to answer), must the
        // connection be closed). Random junk gets a 400 (refused as soon as its request line is wrong), or just a close.
        let cases: [(String, [UInt8], [[Int]], Bool)] = [
            ("invalid request line", Array("GARBAGE\r\n\r\n".utf8), [[400]], true),
            ("binary junk", binary, [[], [400]], true),
            ("HTTP/2 preface", Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8), [[505]], true),
            ("valid request then garbage", Array("GET /healthz HTTP/1.1\r\nHost: a\r\n\r\nNOT HTTP AT ALL\r\n\r\n".utf8),
             [[200, 400]], true),
            ("valid request then junk", Array("GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n".utf8) + binary,
             [[200], [200, 400]], true),
            ("header without a colon", Array("GET /healthz HTTP/1.1\r\nHost: a\r\nNoColonHere\r\n\r\n".utf8), [[400]], true),
            // The target runs up to the last space (as libmicrohttpd read it): a 404 on a connection still in step.
            ("spaces in the target", Array("GET /a b c HTTP/1.1\r\nHost: a\r\n\r\n".utf8), [[404]], false),
        ]
        let results = try await duringAttack("pipelined garbage", on: ingest) {
            try cases.map { name, bytes, expected, mustClose -> (String, [Int], Duration, Bool) in
                var statuses: [Int] = []
                var closed = false
                var rounds = 0
                let started = ContinuousClock.now
                while ContinuousClock.now - started < .milliseconds(500) { // repeated while the good client runs
                    let socket = try TestSocket(port: port)
                    _ = try socket.send(bytes)
                    let end = ContinuousClock.now + .seconds(5)
                    closed = false
                    while ContinuousClock.now < end, !closed, mustClose || socket.statuses.count < expected[0].count {
                        closed = socket.poll(until: end) == .closed
                    }
                    statuses = socket.statuses
                    rounds += 1
                }
                return (name, statuses, (ContinuousClock.now - started) / rounds, closed)
            }
        }
        for ((name, statuses, time, closed), (_, _, expected, mustClose)) in zip(results, cases) {
            print("[hostile] \(name): statuses \(statuses), closed=\(closed), in \(time.ms) ms")
            if mustClose { #expect(closed, "\(name): still open") }
            #expect(expected.contains(statuses), "\(name): \(statuses)")
            #expect(time < .seconds(1), "\(name)")
        }
        await ingest.stop()
    }

    // MARK: Lying bodies

    @Test func bodiesThatLieAboutTheirLength() async throws {
        let ingest = try await Self.start()
        let port = ingest.port
        let head = Self.postHead(ingest)
        let valid = "{\"channel\": \"c\", \"tokenType\": \"alert\", \"deviceToken\": \"\(SecureRandom.hex(32))\"}"
        // (name, bytes, statuses expected, time allowed, must the connection be closed)
        let cases: [(String, String, Set<Int>, Duration, Bool)] = [
            // Declares more than it sends, then stalls: nothing moves, so the idle timeout closes it.
            ("Content-Length larger than sent", head + "Content-Length: 500\r\n\r\n" + valid, [], Self.idle + Self.slack, true),
            // Sends more than declared: the declared part is the request (an invalid body, 400); the rest is read
            // as the start of a next request that never ends, so the idle timeout closes it.
            ("Content-Length smaller than sent", head + "Content-Length: 2\r\n\r\n{}" + valid, [400],
             Self.idle + Self.slack, true),
            ("chunk size not hex", head + "Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", [400], .seconds(1), true),
            ("chunk size overflowing", head + "Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFFFF\r\n{}\r\n0\r\n\r\n",
             [413], .seconds(1), true),
            ("chunk shorter than its size, then stall", head + "Transfer-Encoding: chunked\r\n\r\n100\r\n" + valid,
             [], Self.idle + Self.slack, true),
            // Read on and dropped past the limit, so the 413 leaves the connection in step (kept alive).
            ("chunks over the body limit", head + "Transfer-Encoding: chunked\r\n\r\n"
                + String(repeating: "8000\r\n" + String(repeating: " ", count: 0x8000) + "\r\n", count: 4) + "0\r\n\r\n",
             [413], .seconds(1), false),
            // Both framings (request smuggling): refused with 400 and the connection closed (RFC 9112 §6.1).
            ("Content-Length and Transfer-Encoding", head + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                + "\(String(valid.utf8.count, radix: 16))\r\n\(valid)\r\n0\r\n\r\n", [400], .seconds(1), true),
        ]
        let results = try await duringAttack("lying bodies", on: ingest) {
            try cases.map { name, text, expected, bound, mustClose -> (String, [Int], Duration, Bool) in
                let socket = try TestSocket(port: port)
                _ = try socket.send(text)
                let end = ContinuousClock.now + bound
                var closed = false
                // Until closed, or (when it may stay open) until the expected answers are in.
                while ContinuousClock.now < end, !closed, mustClose || socket.statuses.count < expected.count {
                    closed = socket.poll(until: end) == .closed
                }
                return (name, socket.statuses, ContinuousClock.now - socket.opened, closed)
            }
        }
        for ((name, statuses, time, closed), (_, _, expected, bound, mustClose)) in zip(results, cases) {
            print("[hostile] \(name): statuses \(statuses), closed=\(closed) after \(time.ms) ms")
            if mustClose { #expect(closed, "\(name): still open after \(bound)") }
            #expect(Set(statuses) == expected, "\(name): \(statuses)")
            #expect(time < bound, "\(name)")
        }
        await ingest.stop()
    }
}
