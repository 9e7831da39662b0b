import Foundation
import HeraldRedis
import Testing

/// Against the real Redis started by scripts/test (HERALD_TEST_REDIS_URL).
@Suite struct RedisClientTests {
    @Test func basicCommandsReturnTypedReplies() async throws {
        let client = RedisClient(configuration: try sharedRedisConfiguration())
        let key = freshPrefix() + "greeting"
        #expect(try await client.command(["SET", key, "hello", "EX", "60"]) == .status("OK"))
        #expect(try await client.command(["GET", key]).string == "hello")
        #expect(try await client.command(["GET", key + ":missing"]) == .null)
        #expect(try await client.command(["APPEND", key, " world"]) == .integer(11))
        #expect(try await client.command(["INCRBY", key + ":n", "5"]).int == 5)
        #expect(try await client.command(["GET", key + ":n"]).int == 5)
        try await client.command(["HSET", key + ":h", "a", "1", "b", "2"])
        #expect(try await client.command(["HGETALL", key + ":h"]).fieldValues == ["a": "1", "b": "2"])
        try await client.command(["DEL", key, key + ":n", key + ":h"])
        await client.close()
    }

    @Test func binaryKeysAndValuesRoundTrip() async throws {
        let client = RedisClient(configuration: try sharedRedisConfiguration())
        let key = Array(freshPrefix().utf8) + [0, 255, 13, 10]
        let value = (0...255).map(UInt8.init) + [13, 10, 0]
        #expect(try await client.command([Array("SET".utf8), key, value]) == .status("OK"))
        #expect(try await client.command([Array("GET".utf8), key]) == .bulk(value))
        #expect(try await client.command([Array("STRLEN".utf8), key]) == .integer(259))
        let large = [UInt8]((0..<1_000_000).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        let replies = try await client.pipeline([[Array("SET".utf8), key, large], [Array("GET".utf8), key],
                                                 [Array("DEL".utf8), key]])
        #expect(replies == [.status("OK"), .bulk(large), .integer(1)])
        await client.close()
    }

    @Test func arrayRepliesWithManyElements() async throws {
        let client = RedisClient(configuration: try sharedRedisConfiguration())
        let key = freshPrefix() + "list"
        let values = (0..<10_000).map { "item-\($0)" }
        #expect(try await client.command(["RPUSH", key] + values) == .integer(10_000))
        let listed = try await client.command(["LRANGE", key, "0", "-1"])
        #expect(listed.strings == values)
        try await client.command(["DEL", key])
        await client.close()
    }

    @Test func thousandCommandPipelineRepliesInOrder() async throws {
        let client = RedisClient(configuration: try sharedRedisConfiguration())
        let prefix = freshPrefix()
        var commands: [[String]] = []
        for index in 0..<500 {
            commands.append(["SET", "\(prefix)\(index)", "value-\(index)"])
            commands.append(["GET", "\(prefix)\(index)"])
        }
        let replies = try await client.pipeline(commands)
        #expect(replies.count == 1_000)
        for index in 0..<500 {
            #expect(replies[2 * index] == .status("OK"))
            #expect(replies[2 * index + 1].string == "value-\(index)")
        }
        try await client.command(["DEL"] + (0..<500).map { "\(prefix)\($0)" })
        await client.close()
    }

    @Test func pipelineReturnsErrorRepliesInPlaceAndTransactionsWork() async throws {
        let client = RedisClient(configuration: try sharedRedisConfiguration())
        let key = freshPrefix() + "k"
        let replies = try await client.pipeline([["SET", key, "text"], ["INCR", key], ["GET", key],
                                                 ["MULTI"], ["INCR", key + ":c"], ["INCR", key + ":c"], ["EXEC"]])
        #expect(replies[0] == .status("OK"))
        #expect(replies[1].errorMessage?.hasPrefix("ERR") == true)
        #expect(replies[2].string == "text")
        #expect(replies[3] == .status("OK"))
        #expect(replies[4] == .status("QUEUED"))
        #expect(replies[6] == .array([.integer(1), .integer(2)]))
        try await client.command(["DEL", key, key + ":c"])
        await client.close()
    }

    @Test func serverErrorsAreTypedAndNotConnectionFailures() async throws {
        let client = RedisClient(configuration: try sharedRedisConfiguration())
        let key = freshPrefix() + "s"
        try await client.command(["SET", key, "text"])
        let wrongType = await #expect(throws: RedisError.self) { try await client.command(["LPUSH", key, "x"]) }
        #expect(wrongType?.code == .server)
        #expect(wrongType?.serverErrorPrefix == "WRONGTYPE")
        #expect(wrongType?.isConnectionFailure == false)
        let unknown = await #expect(throws: RedisError.self) { try await client.command(["NOSUCHCOMMAND"]) }
        #expect(unknown?.code == .server)
        #expect(unknown?.message.contains("unknown command") == true)
        // The connection is still usable after error replies.
        #expect(try await client.command(["GET", key]).string == "text")
        try await client.command(["DEL", key])
        await client.close()
    }

    @Test func manyConcurrentTasksGetTheirOwnReplies() async throws {
        let client = RedisClient(configuration: try sharedRedisConfiguration(poolSize: 3))
        let prefix = freshPrefix()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for task in 0..<400 {
                group.addTask {
                    for round in 0..<10 {
                        let value = "task-\(task)-round-\(round)"
                        try await client.command(["SET", "\(prefix)\(task)", value])
                        let read = try await client.command(["GET", "\(prefix)\(task)"])
                        #expect(read.string == value)
                        try await client.command(["INCR", "\(prefix)counter"])
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(try await client.command(["GET", "\(prefix)counter"]).int == 4_000)
        try await client.command(["DEL", "\(prefix)counter"] + (0..<400).map { "\(prefix)\($0)" })
        await client.close()
    }

    @Test func luaScriptUsesEvalshaAndRecoversFromScriptFlush() async throws {
        let client = RedisClient(configuration: try sharedRedisConfiguration())
        let key = freshPrefix() + "script"
        let script = RedisScript(source: "local n = redis.call('INCRBY', KEYS[1], ARGV[1]) return {KEYS[1], n}")
        let loaded = try await client.command(["SCRIPT", "LOAD", script.source])
        #expect(loaded.string == script.sha1)

        #expect(try await client.run(script, keys: [key], args: ["5"]) == .array([.bulk(Array(key.utf8)), .integer(5)]))

        try await client.command(["SCRIPT", "FLUSH"])
        #expect(try await client.command(["SCRIPT", "EXISTS", script.sha1]) == .array([.integer(0)]))
        let unknown = await #expect(throws: RedisError.self) {
            try await client.command(["EVALSHA", script.sha1, "1", key, "1"])
        }
        #expect(unknown?.code == .noScript)

        // NOSCRIPT → EVAL fallback, which also caches the script for the next EVALSHA.
        #expect(try await client.run(script, keys: [key], args: ["2"]).array?.last == .integer(7))
        #expect(try await client.command(["SCRIPT", "EXISTS", script.sha1]) == .array([.integer(1)]))

        let failing = RedisScript(source: "return redis.error_reply('HERALD_DENIED no')")
        let denied = await #expect(throws: RedisError.self) { try await client.run(failing, keys: [], args: []) }
        #expect(denied?.serverErrorPrefix == "HERALD_DENIED")
        try await client.command(["DEL", key])
        await client.close()
    }

    @Test func selectsTheDatabaseFromTheURL() async throws {
        var configuration = try sharedRedisConfiguration(poolSize: 1)
        configuration.database = 3
        let inDatabase3 = RedisClient(configuration: configuration)
        configuration.database = 0
        let inDatabase0 = RedisClient(configuration: configuration)
        let key = freshPrefix() + "db"
        try await inDatabase3.command(["SET", key, "3", "EX", "60"])
        #expect(try await inDatabase3.command(["GET", key]).string == "3")
        #expect(try await inDatabase0.command(["GET", key]) == .null)
        try await inDatabase3.command(["DEL", key])
        await inDatabase3.close()
        await inDatabase0.close()
    }

    @Test func slowReplyTimesOutAndTheConnectionIsReset() async throws {
        let client = RedisClient(configuration: try sharedRedisConfiguration(poolSize: 1, commandTimeout: .milliseconds(300)))
        let key = freshPrefix() + "empty-list"
        // BLPOP blocks only this connection for 2 s; the client must give up after 300 ms.
        var error: RedisError?
        let elapsed = await seconds {
            error = await #expect(throws: RedisError.self) { try await client.command(["BLPOP", key, "2"]) }
        }
        #expect(error?.code == .timeout)
        #expect(error?.isConnectionFailure == true)
        #expect(elapsed >= 0.25 && elapsed < 1.5)
        // Had the connection not been reset, this would read BLPOP's late nil reply instead of PONG.
        #expect(try await client.command(["PING"]) == .status("PONG"))
        await client.close()
    }

    /// A pool batch holds an old request near its deadline and a fresh one: the fresh one gets its own time, not
    /// what the old one had left.
    @Test func aFreshRequestIsNotCutShortByAnOldOneInItsBatch() async throws {
        let client = RedisClient(configuration: try sharedRedisConfiguration(poolSize: 1, commandTimeout: .seconds(2)))
        let key = freshPrefix() + "empty-list"
        // The one connection is busy for 1.8 s; a PING waits behind it (its deadline 2.05 s), then a command that
        // takes 0.6 s joins it (answered at 2.4 s, its deadline 3.6 s).
        async let busy = client.command(["BLPOP", key, "1.8"])
        try await Task.sleep(for: .milliseconds(50))
        async let old = client.command(["PING"])
        try await Task.sleep(for: .milliseconds(1550))
        let fresh = try await client.command(["BLPOP", key, "0.6"])
        #expect(fresh == .null, "answered after the PING's deadline, within its own")
        #expect(try await old == .status("PONG"))
        #expect(try await busy == .null)
        await client.close()
    }

    /// A host name is looked up off the pool's worker (within the call's time) and connects as an address does.
    @Test func aHostNameConnectsThroughTheResolver() async throws {
        var configuration = try sharedRedisConfiguration(poolSize: 1)
        configuration.host = "localhost"
        configuration.seeds = [RedisAddress(host: "localhost", port: configuration.port)]
        let client = RedisClient(configuration: configuration)
        #expect(try await client.command(["PING"]) == .status("PONG"))
        await client.close()
    }

    @Test func closedClientRefusesCalls() async throws {
        let client = RedisClient(configuration: try sharedRedisConfiguration(poolSize: 2))
        #expect(try await client.command(["PING"]) == .status("PONG"))
        await client.close()
        let error = await #expect(throws: RedisError.self) { try await client.command(["PING"]) }
        #expect(error?.code == .closed)
    }
}

/// Failure paths that need no Redis: a closed port and a server that never answers.
@Suite struct RedisFailureTests {
    @Test func connectToClosedPortFailsFastWithConnectionError() async throws {
        let client = RedisClient(configuration: RedisConfiguration(port: try closedPort(), poolSize: 1))
        var error: RedisError?
        let elapsed = await seconds {
            error = await #expect(throws: RedisError.self) { try await client.command(["PING"]) }
        }
        #expect(error?.code == .connection)
        #expect(error?.isConnectionFailure == true)
        #expect(error?.message.contains("refused") == true)
        #expect(elapsed < 0.5)
        await client.close()
    }

    @Test func serverThatNeverAnswersTimesOut() async throws {
        let server = try SilentServer()
        let client = RedisClient(configuration: RedisConfiguration(port: server.port, commandTimeout: .milliseconds(300),
                                                                   poolSize: 2))
        for _ in 0..<2 {
            var error: RedisError?
            let elapsed = await seconds {
                error = await #expect(throws: RedisError.self) { try await client.pipeline([["PING"], ["PING"]]) }
            }
            #expect(error?.code == .timeout)
            #expect(elapsed >= 0.25 && elapsed < 1.5)
        }
        await client.close()
        _ = server
    }

    @Test func fullQueueFailsFastWithOverloaded() async throws {
        let server = try SilentServer()
        let client = RedisClient(configuration: RedisConfiguration(port: server.port, commandTimeout: .seconds(1),
                                                                   poolSize: 1, maxQueuedCommands: 10))
        let codes = await withTaskGroup(of: RedisError.Code?.self) { group in
            for _ in 0..<40 {
                group.addTask {
                    do { _ = try await client.command(["PING"]); return nil } catch { return (error as? RedisError)?.code }
                }
            }
            return await group.reduce(into: [RedisError.Code?]()) { $0.append($1) }
        }
        // The one connection is stuck on a batch; at most 10 more may wait, the rest are refused at once.
        #expect(codes.filter { $0 == .overloaded }.count >= 20)
        #expect(codes.allSatisfy { $0 == .overloaded || $0 == .timeout })
        await client.close()
        _ = server
    }
}

/// A Redis that answers but serves nothing (here: stuck in a script past the busy threshold, as while it loads its
/// dataset after a restart) is unavailable, a retry-later condition, not a server error; in pipelines too, where
/// every command gets the same error reply.
@Suite(.serialized) struct RedisUnavailableTests {
    @Test func busyRedisIsUnavailableForCommandsAndPipelines() async throws {
        let configuration = try sharedRedisConfiguration()
        let admin = RedisClient(configuration: configuration)
        let threshold = try await admin.command(["CONFIG", "GET", "busy-reply-threshold"]).array?.last?.string ?? "5000"
        try await admin.command(["CONFIG", "SET", "busy-reply-threshold", "50"])
        // A script that spins for 0.8 s (it ends by itself, within the client's deadline), on a client of its own.
        let spinner = RedisClient(configuration: configuration)
        let spin = Task {
            try await spinner.command(["EVAL", """
                local function now() local t = redis.call('TIME'); return t[1] * 1000000 + t[2] end
                local stop = now() + 800000
                while now() < stop do end
                return 1
                """, "0"])
        }
        let client = RedisClient(configuration: configuration)
        var seen: [RedisError.Code] = []
        let started = ContinuousClock.now
        while seen.count < 2, ContinuousClock.now - started < .seconds(2) {
            try await Task.sleep(for: .milliseconds(100))
            do {
                _ = try await client.command(["PING"])
            } catch let error as RedisError where error.code == .unavailable {
                #expect(error.isConnectionFailure)
                seen.append(error.code)
                do {
                    _ = try await client.pipeline([["INCR", freshPrefix() + "n"], ["PING"]])
                    Issue.record("a pipeline answered while Redis was busy")
                } catch let error as RedisError {
                    seen.append(error.code)
                }
            }
        }
        _ = try? await spin.value
        try await admin.command(["CONFIG", "SET", "busy-reply-threshold", threshold])
        #expect(seen == [.unavailable, .unavailable])
        #expect(try await client.command(["PING"]) == .status("PONG"))
        // BUSYGROUP and the like are ordinary server errors, not unavailability.
        let stream = freshPrefix() + "stream"
        try await client.command(["XGROUP", "CREATE", stream, "g", "$", "MKSTREAM"])
        await #expect(throws: RedisError(.server, "BUSYGROUP Consumer Group name already exists")) {
            try await client.command(["XGROUP", "CREATE", stream, "g", "$"])
        }
        try await client.command(["DEL", stream])
        for redis in [admin, spinner, client] { await redis.close() }
    }

    @Test("OOM, READONLY, MISCONF and NOREPLICAS are refused writes, also inside a Redis 6 script error; other errors are not")
    func refusedWrites() {
        for message in ["OOM command not allowed when used memory > 'maxmemory'.",
                        "READONLY You can't write against a read only replica.",
                        "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
                        "NOREPLICAS Not enough good replicas to write.",
                        "ERR Error running script (call to f_1a2b): @user_script:3: @user_script: 3: -OOM command not allowed when used memory > 'maxmemory'."] {
            #expect(RedisError.fromReply(message).isRefusingWrites, "\(message)")
        }
        for message in ["ERR wrong number of arguments for 'incr' command", "WRONGTYPE Operation against a key holding the wrong kind of value",
                        "ERR Error running script (call to f_1a2b): @user_script:3: user_script:3: bad argument"] {
            #expect(!RedisError.fromReply(message).isRefusingWrites, "\(message)")
        }
        #expect(!RedisError(.connection, "OOM").isRefusingWrites)
    }
}
