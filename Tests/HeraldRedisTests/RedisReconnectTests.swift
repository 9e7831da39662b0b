import Foundation
import HeraldRedis
import Testing

/// A redis-server of the test's own on a free port, so it can be shut down and restarted without disturbing
/// other tests. Stopped by `stop()`, or by deinit if a test fails before that.
final class OwnRedisServer {
    let port: Int
    let password: String?
    private let arguments: [String]
    private let directory: URL

    /// `arguments` go to redis-server after the test's own (`--cluster-enabled yes`, say).
    init(password: String? = nil, arguments: [String] = []) throws {
        port = try closedPort()
        self.password = password
        self.arguments = arguments
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("herald-redis-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    private var pidFile: String { directory.appendingPathComponent("redis.pid").path }

    func start() async throws {
        var arguments = ["redis-server", "--bind", "127.0.0.1", "--port", "\(port)", "--save", "", "--appendonly", "no",
                         "--daemonize", "yes", "--pidfile", pidFile, "--dir", directory.path,
                         "--logfile", directory.appendingPathComponent("redis.log").path]
        if let password { arguments += ["--requirepass", password] }
        arguments += self.arguments
        let started = try await runTool(arguments)
        try #require(started.status == 0, "redis-server did not start on port \(port)")
        let deadline = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < deadline {
            if try await cli(["PING"]).output.contains("PONG") { return }
            try await Task.sleep(for: .milliseconds(20))
        }
        Issue.record("redis-server on port \(port) did not answer PING within 5 s")
    }

    func shutdown() async throws {
        try await cli(["SHUTDOWN", "NOSAVE"])
        let deadline = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < deadline, FileManager.default.fileExists(atPath: pidFile) {
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Kills the server at once (SIGKILL), as a crash would, and returns when it no longer answers.
    func crash() async throws {
        let text = try String(contentsOfFile: pidFile, encoding: .utf8)
        let pid = try #require(Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)))
        kill(pid, SIGKILL)
        try? FileManager.default.removeItem(atPath: pidFile)
        let deadline = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < deadline, try await cli(["PING"]).output.contains("PONG") {
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    @discardableResult
    func cli(_ command: [String]) async throws -> (status: Int32, output: String) {
        var arguments = ["redis-cli", "-p", "\(port)"]
        if let password { arguments += ["-a", password, "--no-auth-warning"] }
        return try await runTool(arguments + command)
    }

    /// Last resort when a test failed before shutting the server down. SIGKILL, because a child of the test
    /// process inherits its blocked signal mask and would ignore SIGTERM; the server keeps no data worth saving.
    deinit {
        if let text = try? String(contentsOfFile: pidFile, encoding: .utf8), let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)), pid > 0 {
            kill(pid, SIGKILL)
        }
        try? FileManager.default.removeItem(at: directory)
    }
}

@Suite struct RedisReconnectTests {
    @Test func sameClientWorksAgainAfterTheServerRestarts() async throws {
        let server = try OwnRedisServer()
        try await server.start()
        let client = RedisClient(configuration: RedisConfiguration(port: server.port, connectTimeout: .milliseconds(500),
                                                                   commandTimeout: .seconds(1), poolSize: 2))
        #expect(try await client.command(["SET", "before", "1"]) == .status("OK"))
        // Open both pooled connections so both must notice the restart.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<50 { group.addTask { _ = try await client.command(["PING"]) } }
            try await group.waitForAll()
        }

        try await server.shutdown()
        for _ in 0..<4 {
            let error = await #expect(throws: RedisError.self) { try await client.command(["GET", "before"]) }
            #expect(error?.isConnectionFailure == true)
            #expect(error?.code == .connection)
        }

        try await server.start()
        #expect(try await client.command(["GET", "before"]) == .null, "a restarted --save '' server is empty")
        let replies = try await withThrowingTaskGroup(of: RedisValue.self) { group in
            for _ in 0..<20 { group.addTask { try await client.command(["INCR", "after"]) } }
            return try await group.reduce(into: [RedisValue]()) { $0.append($1) }
        }
        #expect(Set(replies) == Set((1...20).map { RedisValue.integer($0) }))

        // A restart nobody called through: the idle connections are stale, yet the very next call succeeds.
        try await server.shutdown()
        try await server.start()
        #expect(try await client.command(["INCR", "after"]) == .integer(1))

        await client.close()
        try await server.shutdown()
    }

    @Test func authenticatesOnEveryNewConnection() async throws {
        let server = try OwnRedisServer(password: "herald-secret")
        try await server.start()

        let good = RedisClient(configuration: try RedisConfiguration(url: "redis://:herald-secret@127.0.0.1:\(server.port)/2",
                                                                     poolSize: 1))
        try await good.command(["SET", "k", "v"])
        #expect(try await server.cli(["-n", "2", "GET", "k"]).output.contains("v"))

        let bad = RedisClient(configuration: try RedisConfiguration(url: "redis://:wrong@127.0.0.1:\(server.port)/0",
                                                                    poolSize: 1))
        let refused = await #expect(throws: RedisError.self) { try await bad.command(["PING"]) }
        #expect(refused?.code == .authentication)
        #expect(refused?.isConnectionFailure == true)
        #expect(refused?.message.contains("wrong") == false)

        let anonymous = RedisClient(configuration: RedisConfiguration(port: server.port, poolSize: 1))
        let denied = await #expect(throws: RedisError.self) { try await anonymous.command(["GET", "k"]) }
        #expect(denied?.serverErrorPrefix == "NOAUTH")

        await good.close()
        await bad.close()
        await anonymous.close()
        try await server.shutdown()
    }
}
