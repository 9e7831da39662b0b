import Foundation
import HeraldHTTP
import HeraldRedis
import HeraldRuntime
import HeraldTestSupport
import Testing

/// A real HTTP server (one worker loop by default) whose only route runs test code inside its handler, so that the
/// code runs as herald's handlers do: on the loop thread, with the loop as its task executor.
final class LoopHarness: Sendable {
    private let server: HTTPServer
    private let running: Task<Void, any Error>
    private let bodies: Lock<[String: @Sendable () async -> Void]>
    private let port: UInt16

    init(threads: Int = 1) throws {
        let bodies = Lock<[String: @Sendable () async -> Void]>([:])
        var router = Router()
        router.get("/run/{id}") { request in
            let id = try request.pathParameter("id")
            guard let body = bodies.withLock({ $0.removeValue(forKey: id) }) else { return HTTPResponse(status: 404) }
            await body()
            return .text("ran")
        }
        var configuration = HTTPServerConfiguration(address: HostPort(host: "127.0.0.1", port: 0), threads: threads)
        configuration.requestDeadline = .seconds(60)
        let server = try HTTPServer(configuration: configuration, router: router,
                                    logger: Logger(label: "loop-test", minimumLevel: .warning), metrics: MetricsRegistry())
        self.bodies = bodies
        self.server = server
        port = server.localAddress.port
        running = Task { try await server.run() }
    }

    /// Runs `body` inside a request handler on the server's loop and returns what it returned (or throws what it
    /// threw).
    func onLoop<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let result = Lock<Result<T, any Error>?>(nil)
        let id = UUID().uuidString
        bodies.withLock {
            $0[id] = {
                let outcome: Result<T, any Error>
                do { outcome = .success(try await body()) } catch { outcome = .failure(error) }
                result.withLock { $0 = outcome }
            }
        }
        let port = port
        let response = try await onThread { try RawHTTPClient(port: port, timeout: 60).request("GET", "/run/\(id)") }
        try #require(response.status == 200, "the handler did not run: \(response.status)")
        return try #require(result.withLock { $0 }).get()
    }

    func stop() async throws {
        running.cancel()
        try await running.value
    }
}

/// The code of the `RedisError` `body` throws; nil when it succeeds.
@Sendable func errorCode(_ body: @Sendable () async throws -> Void) async -> RedisError.Code? {
    do {
        try await body()
        return nil
    } catch let error as RedisError {
        return error.code
    } catch {
        return nil
    }
}

@Suite("Redis calls on the HTTP worker loops")
struct LoopConnectionTests {
    @Test func handlerCallsUseTheLoopConnectionAcrossAwaits() async throws {
        let harness = try LoopHarness()
        let client = RedisClient(configuration: try sharedRedisConfiguration(poolSize: 1))
        let poolID = try #require(try await client.command(["CLIENT", "ID"]).int)
        #expect(client.loopConnectionCount == 0, "a call off the loops uses the pool")

        let seen = try await harness.onLoop {
            var onLoop = [LoopThread.current != nil]
            let first = try await client.command(["CLIENT", "ID"]).int
            // Resumed by a timer elsewhere: the task must come back to the loop, and so must its next call.
            try await Task.sleep(for: .milliseconds(5))
            onLoop.append(LoopThread.current != nil)
            let second = try await client.command(["CLIENT", "ID"]).int
            // Child tasks (as /readyz's `async let`) inherit the loop as executor.
            async let third = client.command(["CLIENT", "ID"]).int
            async let fourth = client.pipeline([["CLIENT", "ID"], ["PING"]])
            let (childID, pipelined) = try await (third, fourth)
            onLoop.append(LoopThread.current != nil)
            return (onLoop, [first, second, childID, pipelined[0].int])
        }
        #expect(seen.0 == [true, true, true])
        let ids = seen.1.compactMap { $0 }
        #expect(ids.count == 4)
        #expect(Set(ids).count == 1, "every call in the handler went over one connection: \(ids)")
        #expect(ids.first != poolID, "the handler's calls did not go through the pool")
        #expect(client.loopConnectionCount == 1)
        #expect(LoopThread.current == nil)

        await client.close()
        #expect(client.loopConnectionCount == 0)
        try await harness.stop()
    }

    /// Commands, binary arguments, pipelines with error replies in place, MULTI/EXEC and a script's NOSCRIPT
    /// fallback, run through one client, described so that two runs can be compared.
    static func exercise(_ client: RedisClient, prefix: String, script: RedisScript) async throws -> [String] {
        var log: [String] = []
        let binary = (0...255).map(UInt8.init) + [0, 13, 10, 36, 42]
        log.append("\(try await client.command([Array("SET".utf8), Array((prefix + "bin").utf8), binary]))")
        log.append("\(try await client.command([Array("GET".utf8), Array((prefix + "bin").utf8)]) == .bulk(binary))")
        log.append("\(try await client.pipeline([["SET", prefix + "s", "text"], ["INCR", prefix + "s"], ["GET", prefix + "s"], ["GET", prefix + "missing"], ["RPUSH", prefix + "l", "a", "b"], ["LRANGE", prefix + "l", "0", "-1"]]))")
        log.append("\(try await client.pipeline([["MULTI"], ["INCR", prefix + "n"], ["INCRBY", prefix + "n", "5"], ["EXEC"]]))")
        log.append("\(try await client.pipeline([[Array("HSET".utf8), Array((prefix + "h").utf8), [0, 1], binary]]))")
        let failure = await #expect(throws: RedisError.self) { try await client.command(["LPUSH", prefix + "s", "x"]) }
        log.append("\(failure?.code as Any) \(failure?.serverErrorPrefix ?? "")")
        log.append("\(try await client.command(["SCRIPT", "EXISTS", script.sha1]))")
        log.append("\(try await client.run(script, keys: [prefix + "k"], args: ["value"]))")
        log.append("\(try await client.command(["SCRIPT", "EXISTS", script.sha1]))")
        log.append("\(try await client.run(script, keys: [prefix + "k"], args: ["longer value"]))")
        return log
    }

    @Test func resultsMatchThePoolPath() async throws {
        let harness = try LoopHarness()
        let client = RedisClient(configuration: try sharedRedisConfiguration(poolSize: 1))
        // A script of its own per path, so that each path meets NOSCRIPT first.
        func script() -> RedisScript {
            RedisScript(source: "-- \(UUID().uuidString)\nredis.call('SET', KEYS[1], ARGV[1]) return redis.call('STRLEN', KEYS[1])")
        }
        let viaPool = try await Self.exercise(client, prefix: freshPrefix(), script: script())
        let loopPrefix = freshPrefix()
        let loopScript = script()
        let viaLoop = try await harness.onLoop { try await Self.exercise(client, prefix: loopPrefix, script: loopScript) }
        #expect(viaLoop == viaPool)
        #expect(viaPool.count == 10)
        #expect(viaPool[6] == "\(RedisValue.array([.integer(0)]))" && viaPool[8] == "\(RedisValue.array([.integer(1)]))",
                "the first run went through the NOSCRIPT fallback")
        #expect(client.loopConnectionCount == 1)
        await client.close()
        try await harness.stop()
    }

    @Test func largePipelinesAndValuesGoThroughPartialWrites() async throws {
        let harness = try LoopHarness()
        let client = RedisClient(configuration: try sharedRedisConfiguration(poolSize: 1, commandTimeout: .seconds(20)))
        let prefix = freshPrefix()
        let matched = try await harness.onLoop {
            // 2,000 × 4 KiB (8 MiB in one pipeline), then one 6 MiB value: far more than a socket buffer.
            let values = (0..<2_000).map { index in (0..<4_096).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ index) } }
            let sets = values.indices.map { [Array("SET".utf8), Array("\(prefix)\($0)".utf8), values[$0]] }
            let stored = try await client.pipeline(sets)
            let gets = values.indices.map { [Array("GET".utf8), Array("\(prefix)\($0)".utf8)] }
            let read = try await client.pipeline(gets)
            let big = (0..<6 << 20).map { UInt8(truncatingIfNeeded: $0 &* 7) }
            try await client.command([Array("SET".utf8), Array("\(prefix)big".utf8), big])
            let bigBack = try await client.command([Array("GET".utf8), Array("\(prefix)big".utf8)])
            return [stored.allSatisfy { $0 == .status("OK") }, read == values.map { RedisValue.bulk($0) },
                    bigBack == .bulk(big)]
        }
        #expect(matched == [true, true, true])
        #expect(client.loopConnectionCount == 1)
        try await client.command(["DEL", "\(prefix)big"])
        await client.close()
        try await harness.stop()
    }

    @Test func deadlineFailsWithTimeoutAndOverloadIsImmediate() async throws {
        let server = try OwnRedisServer()
        try await server.start()
        let harness = try LoopHarness()
        let client = RedisClient(configuration: RedisConfiguration(port: server.port, connectTimeout: .seconds(1),
                                                                   commandTimeout: .milliseconds(300), poolSize: 1,
                                                                   maxQueuedCommands: 10))
        #expect(try await harness.onLoop { try await client.command(["PING"]) } == .status("PONG"))

        try await server.cli(["CLIENT", "PAUSE", "1500", "ALL"])
        let outcome = try await harness.onLoop {
            let start = ContinuousClock.now
            async let blocked = errorCode { _ = try await client.pipeline(Array(repeating: ["PING"], count: 8)) }
            try await Task.sleep(for: .milliseconds(50))
            // 8 waiting + 3 > 10: refused at once, not queued behind the paused server.
            let overloadStart = ContinuousClock.now
            let overloaded = await errorCode { _ = try await client.pipeline(Array(repeating: ["PING"], count: 3)) }
            let overloadTook = ContinuousClock.now - overloadStart
            let code = await blocked
            return (code, ContinuousClock.now - start, overloaded, overloadTook)
        }
        #expect(outcome.0 == .timeout)
        #expect(outcome.1 >= .milliseconds(290) && outcome.1 < .milliseconds(900), "timed out after \(outcome.1)")
        #expect(outcome.2 == .overloaded)
        #expect(outcome.3 < .milliseconds(100))

        try await Task.sleep(for: .milliseconds(1_300))
        #expect(try await harness.onLoop { try await client.command(["PING"]) } == .status("PONG"),
                "the next call after the pause reconnects")
        await client.close()
        try await harness.stop()
        try await server.shutdown()
    }

    @Test func killedServerFailsWithConnectionThenRecovers() async throws {
        let server = try OwnRedisServer()
        try await server.start()
        let harness = try LoopHarness()
        let client = RedisClient(configuration: RedisConfiguration(port: server.port, connectTimeout: .milliseconds(500),
                                                                   commandTimeout: .seconds(5), poolSize: 1))
        #expect(try await harness.onLoop { try await client.command(["SET", "k", "v"]) } == .status("OK"))

        async let inFlight = harness.onLoop {
            let start = ContinuousClock.now
            let code = await errorCode { _ = try await client.command(["BLPOP", "nothing", "4"]) }
            return (code, ContinuousClock.now - start)
        }
        try await Task.sleep(for: .milliseconds(300))
        try await server.crash()
        let (code, took) = try await inFlight
        #expect(code == .connection)
        #expect(took < .seconds(2), "the broken connection was noticed at once, not at the deadline (\(took))")

        let whileDown = try await harness.onLoop { await errorCode { _ = try await client.command(["PING"]) } }
        #expect(whileDown == .connection)

        try await server.start()
        #expect(try await harness.onLoop { try await client.command(["INCR", "after"]) } == .integer(1))
        #expect(client.loopConnectionCount == 1)
        await client.close()
        try await harness.stop()
        try await server.shutdown()
    }

    @Test func handshakeAuthenticatesAndSelects() async throws {
        let server = try OwnRedisServer(password: "herald-secret")
        try await server.start()
        let harness = try LoopHarness()
        let good = RedisClient(configuration: try RedisConfiguration(url: "redis://:herald-secret@127.0.0.1:\(server.port)/2",
                                                                     poolSize: 1))
        #expect(try await harness.onLoop { try await good.command(["SET", "k", "on-loop"]) } == .status("OK"))
        #expect(try await server.cli(["-n", "2", "GET", "k"]).output.contains("on-loop"))

        let bad = RedisClient(configuration: try RedisConfiguration(url: "redis://:wrong@127.0.0.1:\(server.port)/0",
                                                                    poolSize: 1))
        let refused = try await harness.onLoop { () -> RedisError? in
            do {
                _ = try await bad.pipeline([["PING"], ["PING"]])
                return nil
            } catch let error as RedisError {
                return error
            }
        }
        #expect(refused?.code == .authentication)
        #expect(refused?.message.contains("wrong") == false)
        #expect(good.loopConnectionCount == 1 && bad.loopConnectionCount == 1)

        // A database the server does not have: SELECT is refused, and the call's write must not run on database 0.
        let missing = RedisClient(configuration: try RedisConfiguration(url: "redis://:herald-secret@127.0.0.1:\(server.port)/99",
                                                                        poolSize: 1))
        let notSelected = try await harness.onLoop { await errorCode { _ = try await missing.command(["SET", "stray", "x"]) } }
        #expect(notSelected != nil)
        #expect(try await server.cli(["-n", "0", "EXISTS", "stray"]).output.contains("0"), "written to database 0")

        await good.close()
        await bad.close()
        await missing.close()
        try await harness.stop()
        try await server.shutdown()
    }

    @Test func closingTheClientFailsWaitingLoopCalls() async throws {
        let harness = try LoopHarness()
        let client = RedisClient(configuration: try sharedRedisConfiguration(poolSize: 1, commandTimeout: .seconds(5)))
        let key = freshPrefix() + "list"
        async let inFlight = harness.onLoop {
            let start = ContinuousClock.now
            let code = await errorCode { _ = try await client.command(["BLPOP", key, "4"]) }
            return (code, ContinuousClock.now - start)
        }
        try await Task.sleep(for: .milliseconds(300))
        await client.close()
        let (code, took) = try await inFlight
        #expect(code == .closed)
        #expect(took < .seconds(2))
        #expect(try await harness.onLoop { await errorCode { _ = try await client.command(["PING"]) } } == .closed)
        try await harness.stop()
    }
}
