import Foundation
@testable import HeraldRedis
import HeraldTestSupport
import Testing

/// Against the Redis Cluster scripts/test starts (3 masters, 3 replicas; HERALD_TEST_REDIS_CLUSTER_URL).
@Suite(.serialized) struct RedisClusterTests {
    @Test func slotsAgreeWithRedis() async throws {
        let client = try clusterClient()
        let keys = ["foo", "", "{user1000}.following", "{user1000}.followers", "a{}b", "{}{x}", "x{y", "}{z}",
                    "herald:{app}:sub:1"] + (0..<200).map { "herald:test:\($0):\(UUID().uuidString)" }
        for key in keys {
            #expect(try await client.command(["CLUSTER", "KEYSLOT", key]).int == Int64(RedisCluster.slot(of: key)), "\(key)")
        }
        #expect(RedisCluster.slot(of: "{user1000}.following") == RedisCluster.slot(of: "{user1000}.followers"))
        await client.close()
    }

    @Test func keysSpreadOverEveryMasterAndReadBack() async throws {
        let client = try clusterClient()
        let prefix = freshPrefix()
        for index in 0..<300 { try await client.command(["SET", "\(prefix)\(index)", "v\(index)", "EX", "60"]) }
        for index in 0..<300 { #expect(try await client.command(["GET", "\(prefix)\(index)"]).string == "v\(index)") }
        let masters = try await clusterMasters()
        #expect(masters.count == 3)
        for master in masters {
            let count = try await runTool(["redis-cli", "-p", String(master.port), "EVAL",
                                           "return #redis.call('KEYS', ARGV[1])", "0", prefix + "*"])
            #expect((Int(count.output.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0) > 50,
                    "master \(master.port) holds \(count.output)")
        }
        await client.close()
    }

    /// A client with one seed calls it as a standalone Redis until it has answered whether it is a cluster: a
    /// pipeline in that moment has its commands for other nodes redirected, and follows them.
    @Test func aPipelineBeforeTheSeedHasAnsweredFollowsItsRedirections() async throws {
        let seed = try firstSeedPort()
        let client = RedisClient(configuration: try RedisConfiguration(url: "redis://127.0.0.1:\(seed)"))
        let prefix = freshPrefix()
        let keys = (0..<30).map { "\(prefix)\($0)" } // spread over the three masters
        let replies = try await client.pipeline(keys.map { ["SET", $0, "v-" + $0, "EX", "60"] }) // the client's first call
        #expect(replies == Array(repeating: .status("OK"), count: keys.count))
        let reader = try clusterClient()
        for key in keys { #expect(try await reader.command(["GET", key]).string == "v-" + key) }
        #expect(try await client.isCluster())
        await reader.close()
        await client.close()
    }

    @Test func pipelineAcrossNodesAnswersInOrder() async throws {
        let client = try clusterClient()
        let prefix = freshPrefix()
        var commands: [[String]] = []
        for index in 0..<400 {
            commands.append(["SET", "\(prefix)\(index)", "value-\(index)", "EX", "60"])
            commands.append(["GET", "\(prefix)\(index)"])
        }
        commands.append(["HSET", prefix + "wrong-type", "f", "1"])
        commands.append(["GET", prefix + "wrong-type"])
        let replies = try await client.pipeline(commands)
        #expect(replies.count == 802)
        for index in 0..<400 {
            #expect(replies[2 * index] == .status("OK"))
            #expect(replies[2 * index + 1].string == "value-\(index)")
        }
        guard case .error(let message) = replies[801] else { Issue.record("expected WRONGTYPE"); return }
        #expect(message.hasPrefix("WRONGTYPE"), "an error reply stays in place")
        try await client.command(["DEL", prefix + "wrong-type"])
        await client.close()
    }

    /// A pipeline spanning nodes goes to all of them at once: when one node does not answer in time the call fails
    /// with that node's timeout (after one timeout, not one per node), and the other node's commands still ran.
    @Test func aPipelineAcrossNodesFailsWithTheNodeThatDidNotAnswer() async throws {
        let masters = try await clusterMasters()
        try #require(masters.count >= 2)
        let prefix = freshPrefix()
        func key(on master: ClusterMaster) -> String {
            (0...).lazy.map { "\(prefix)\($0)" }.first { master.serves(RedisCluster.slot(of: $0)) }!
        }
        let (paused, answering) = (key(on: masters[0]), key(on: masters[1]))
        var configuration = try RedisConfiguration(url: try TestEnvironment.redisClusterURL())
        configuration.commandTimeout = .milliseconds(300)
        let client = RedisClient(configuration: configuration)
        try await client.command(["SET", paused, "before", "EX", "60"])
        try await client.command(["SET", answering, "before", "EX", "60"])
        _ = try await runTool(["redis-cli", "-p", String(masters[0].port), "CLIENT", "PAUSE", "1500", "ALL"])
        let started = ContinuousClock.now
        let error = await #expect(throws: RedisError.self) {
            try await client.pipeline([["SET", paused, "after", "EX", "60"], ["SET", answering, "after", "EX", "60"]])
        }
        let waited = ContinuousClock.now - started
        #expect(error?.code == .timeout)
        #expect(waited < .milliseconds(1_000), "failed after \(waited)")
        _ = try await runTool(["redis-cli", "-p", String(masters[0].port), "CLIENT", "UNPAUSE"])
        #expect(try await client.command(["GET", answering]).string == "after")
        for key in [paused, answering] { try await client.command(["DEL", key]) }
        await client.close()
    }

    @Test func scriptsRunOnTheirKeysNode() async throws {
        let client = try clusterClient()
        let script = RedisScript(source: "redis.call('SET', KEYS[1], ARGV[1]); redis.call('SET', KEYS[2], ARGV[1]); return redis.call('GET', KEYS[2])")
        for index in 0..<30 {
            let tag = "{\(freshPrefix())\(index)}"
            let reply = try await client.run(script, keys: [tag + ":a", tag + ":b"], args: ["x\(index)"])
            #expect(reply.string == "x\(index)")
            try await client.command(["DEL", tag + ":a", tag + ":b"])
        }
        await client.close()
    }

    /// A slot migrated under the client: while it moves the old node answers ASK, once moved MOVED; the client
    /// follows both and goes straight to the new node afterwards.
    @Test func askAndMovedAreFollowed() async throws {
        let client = try clusterClient()
        let key = freshPrefix() + "migrating"
        try await client.command(["SET", key, "here"])
        let slot = RedisCluster.slot(of: key)
        let masters = try await clusterMasters()
        let source = try #require(masters.first { $0.serves(slot) })
        let target = try #require(masters.first { $0.id != source.id })
        try await startMovingSlot(slot, from: source, to: target, migrating: [key])
        var failure: (any Error)?
        do {
            #expect(try await client.command(["GET", key]).string == "here", "ASK followed")
            try await finishMovingSlot(slot, from: source, to: target, among: masters)
            #expect(try await client.command(["GET", key]).string == "here", "MOVED followed")
            let moved = try await client.pipeline([["GET", key], ["SET", key, "again"], ["GET", key]])
            #expect(moved == [.bulk(Array("here".utf8)), .status("OK"), .bulk(Array("again".utf8))])
        } catch { failure = error }
        // Back where it was, for the other tests.
        try await startMovingSlot(slot, from: target, to: source, migrating: [key])
        try await finishMovingSlot(slot, from: target, to: source, among: masters)
        if let failure { throw failure }
        #expect(try await client.command(["GET", key]).string == "again")
        try await client.command(["DEL", key])
        await client.close()
    }

    /// Keys of one hash tag split between two masters while their slot migrates (the source has one, the target
    /// the other): a command on both is answered `TRYAGAIN` until the second key moves too. The client sends it
    /// again a moment later, alone or in a pipeline beside another master's command, instead of failing the call.
    @Test func aCommandOnKeysSplitByAMigrationIsSentAgain() async throws {
        let client = try clusterClient()
        let tag = "{\(freshPrefix())}", first = tag + ":a", second = tag + ":b"
        let slot = RedisCluster.slot(of: tag)
        let masters = try await clusterMasters()
        let source = try #require(masters.first { $0.serves(slot) })
        let target = try #require(masters.first { $0.id != source.id })
        let sourceNode = try #require(try await client.masters().first { $0.address.contains(":\(source.port)/") })
        let elsewhere = try #require((0..<100).lazy.map { _ in freshPrefix() + "elsewhere" }
            .first { key in !source.serves(RedisCluster.slot(of: key)) })
        for pipelined in [false, true] {
            var failure: (any Error)?
            do {
                try await client.pipeline([["SET", first, "1", "EX", "60"], ["SET", second, "2", "EX", "60"]])
                let refusedBefore = try await tryAgainReplies(by: source.port)
                try await startMovingSlot(slot, from: source, to: target, migrating: [first])
                // The resharding tool's next MIGRATE, while the call waits out TRYAGAIN.
                let mover = Task {
                    try await Task.sleep(for: .milliseconds(10))
                    _ = try await sourceNode.command(["MIGRATE", "127.0.0.1", String(target.port), second, "0", "5000"])
                }
                do {
                    let both = RedisValue.array([.bulk(Array("1".utf8)), .bulk(Array("2".utf8))])
                    if pipelined {
                        let replies = try await client.pipeline([["MGET", first, second],
                                                                 ["SET", elsewhere, "x", "EX", "60"]])
                        #expect(replies == [both, .status("OK")])
                    } else {
                        #expect(try await client.command(["MGET", first, second]) == both)
                    }
                } catch { failure = error }
                try await mover.value
                #expect(try await tryAgainReplies(by: source.port) > refusedBefore, "the call met TRYAGAIN")
            } catch { failure = failure ?? error }
            // Back where they were, whatever failed: the source serving the slot as before (a migrating source would
            // redirect them to the target again), the target handing them over (it serves keys of a slot it
            // imports only after ASKING), then no longer importing.
            _ = try await clusterAdmin(source.port, "CLUSTER", "SETSLOT", String(slot), "STABLE")
            for key in [first, second] {
                _ = try runTool("redis-cli", ["-p", String(target.port)],
                                input: Data("ASKING\nMIGRATE 127.0.0.1 \(source.port) \(key) 0 5000\n".utf8))
            }
            _ = try await clusterAdmin(target.port, "CLUSTER", "SETSLOT", String(slot), "STABLE")
            if let failure { throw failure }
            // Key by key: the slot may hold other tests' keys too.
            for key in [first, second] {
                #expect(try await clusterAdmin(source.port, "EXISTS", key).trimmingCharacters(in: .whitespacesAndNewlines) == "1",
                        "\(key) back on the source")
            }
        }
        try await client.pipeline([["DEL", first], ["DEL", second], ["DEL", elsewhere]])
        await client.close()
    }

    /// A pipeline whose slot moved to another master under the client is answered `MOVED` command by command, and
    /// sent again to the new master as a pipeline: a few reads there, not one round trip per command.
    @Test func aPipelineWhoseSlotMovedIsSentAgainTogether() async throws {
        let client = try clusterClient()
        #expect(try await client.isCluster()) // the map as it is now
        try await withAnEmptySlotMoved { tag, slot, target in
            let keys = (0..<300).map { "\(tag):\($0)" }
            let readsBefore = try await readsProcessed(by: target.port)
            let replies = try await client.pipeline(keys.map { ["SET", $0, "v-" + $0, "EX", "60"] })
            #expect(replies == Array(repeating: .status("OK"), count: keys.count))
            let reads = try await readsProcessed(by: target.port) - readsBefore
            #expect(reads < 60, "\(reads) reads on the new master for \(keys.count) redirected commands")
            let stored = try await runTool(["redis-cli", "-p", String(target.port), "CLUSTER", "COUNTKEYSINSLOT", String(slot)])
            #expect(stored.output.trimmingCharacters(in: .whitespacesAndNewlines) == "300")
            try await client.pipeline(keys.map { ["DEL", $0] })
        }
        await client.close()
    }

    /// A transaction whose slot moved fails whole (`MOVED`, then `EXECABORT`), but its `MOVED` still updates the
    /// map: the same transaction sent again goes to the new master. `multi` in any case is a transaction.
    @Test func aTransactionWhoseSlotMovedTeachesTheMap() async throws {
        let client = try clusterClient()
        #expect(try await client.isCluster())
        try await withAnEmptySlotMoved { tag, _, _ in
            let transaction = [["multi"], ["SET", tag + ":t", "1", "EX", "60"], ["EXEC"]].map { $0.map { Array($0.utf8) } }
            let first = try await client.pipeline(transaction)
            #expect(first.last.map { if case .error = $0 { true } else { false } } == true, "\(first)")
            let again = try await client.pipeline(transaction)
            #expect(again.last == .array([.status("OK")]), "\(again)")
            try await client.command(["DEL", tag + ":t"])
        }
        await client.close()
    }

    /// A hash tag whose slot holds no key (it can change hands without migrating any), the slot and its master.
    private func emptySlot(among masters: [ClusterMaster]) async throws -> (tag: String, slot: Int, owner: ClusterMaster) {
        for _ in 0..<50 {
            let tag = "{\(freshPrefix())}"
            let slot = RedisCluster.slot(of: tag)
            let owner = try #require(masters.first { $0.serves(slot) })
            let count = try await clusterAdmin(owner.port, "CLUSTER", "COUNTKEYSINSLOT", String(slot))
            if count.trimmingCharacters(in: .whitespacesAndNewlines) == "0" { return (tag, slot, owner) }
        }
        throw RedisError(.unavailable, "no empty slot found in 50 tries")
    }

    /// Moves a slot that holds no key (it can change hands without migrating any) from its master to another,
    /// runs `body` with a hash tag of that slot, the slot and its new master, then moves it back.
    private func withAnEmptySlotMoved(_ body: (String, Int, ClusterMaster) async throws -> Void) async throws {
        let masters = try await clusterMasters()
        let (tag, slot, source) = try await emptySlot(among: masters)
        let target = try #require(masters.first { $0.id != source.id })
        try await startMovingSlot(slot, from: source, to: target)
        try await finishMovingSlot(slot, from: source, to: target, among: masters)
        var failure: (any Error)?
        do { try await body(tag, slot, target) } catch { failure = error }
        try await startMovingSlot(slot, from: target, to: source)
        try await finishMovingSlot(slot, from: target, to: source, among: masters)
        if let failure { throw failure }
    }

    /// The first half of moving a slot as `redis-cli --cluster reshard` does: the target importing it, the source
    /// migrating it (answering `ASK` for keys it no longer has), then `keys` migrated.
    private func startMovingSlot(_ slot: Int, from source: ClusterMaster, to target: ClusterMaster,
                                 migrating keys: [String] = []) async throws {
        _ = try await clusterAdmin(target.port, "CLUSTER", "SETSLOT", String(slot), "IMPORTING", source.id)
        _ = try await clusterAdmin(source.port, "CLUSTER", "SETSLOT", String(slot), "MIGRATING", target.id)
        for key in keys { _ = try await clusterAdmin(source.port, "MIGRATE", "127.0.0.1", String(target.port), key, "0", "5000") }
    }

    /// The second half: `SETSLOT NODE` on the target first, where assigning an importing slot to itself bumps its
    /// config epoch, so its claim outranks the gossip of every node (a plain `SETSLOT NODE` keeps the epoch, and a
    /// replica whose master's epoch is higher talks the target out of the slot again); then on the other masters.
    /// Returns once every node, replicas included, names the target.
    private func finishMovingSlot(_ slot: Int, from source: ClusterMaster, to target: ClusterMaster,
                                  among masters: [ClusterMaster]) async throws {
        for master in [target, source] + masters.filter({ $0.id != target.id && $0.id != source.id }) {
            _ = try await clusterAdmin(master.port, "CLUSTER", "SETSLOT", String(slot), "NODE", target.id)
        }
        try await eventually("every node names the slot's new master", timeout: .seconds(30)) {
            for port in try await clusterNodePorts() {
                guard try await clusterMasters(asSeenBy: port).first(where: { $0.serves(slot) })?.id == target.id else { return false }
            }
            return true
        }
    }

    /// A slot an operator unassigns (`CLUSTER DELSLOTS`, after a master without a replica was lost) answers
    /// 503-style `unavailable`; once it is assigned again the client finds its node by itself.
    @Test func anUnassignedSlotIsServedAgainOnceAssigned() async throws {
        let client = try clusterClient()
        #expect(try await client.isCluster())
        let masters = try await clusterMasters()
        let (tag, slot, owner) = try await emptySlot(among: masters)
        let key = tag + "k"
        try await client.command(["GET", key]) // the map is known
        for master in masters { _ = try await clusterAdmin(master.port, "CLUSTER", "DELSLOTS", String(slot)) }
        try await eventually("the client's map has no node for the slot", timeout: .seconds(15)) {
            do { try await client.command(["GET", key]); return false } catch let error as RedisError {
                return error.description.contains("no node serves slot \(slot)")
            }
        }
        _ = try await clusterAdmin(owner.port, "CLUSTER", "ADDSLOTS", String(slot))
        for master in masters where master.id != owner.id {
            _ = try await clusterAdmin(master.port, "CLUSTER", "SETSLOT", String(slot), "NODE", owner.id)
        }
        try await eventually("the slot is served again without a restart", timeout: .seconds(15)) {
            (try? await client.command(["SET", key, "1", "EX", "60"])) != nil
        }
        try await client.command(["DEL", key])
        await client.close()
    }

    /// The map refresh that follows a node's failed call asks that node last: one that is down would hold the
    /// refresh for its whole timeout. (Checked on a closed client, whose failures queue no refresh to clear them.)
    @Test func aRefreshAsksTheNodesWhoseCallsFailedLast() async throws {
        let client = try clusterClient()
        #expect(try await client.isCluster())
        let masters = Set(try await clusterMasters().map(\.port))
        await client.close()
        let before = client.topology.refreshCandidates
        #expect(Set(before.prefix(3).map(\.port)) == masters)
        for failed in [before[0], before[1]] {
            client.topology.callFailed(RedisError(.timeout, "no reply in time"), on: failed)
        }
        let after = client.topology.refreshCandidates
        #expect(after.count == before.count)
        #expect(after.suffix(2) == [before[0], before[1]].sorted { $0.description < $1.description })
        #expect(after.first == before[2])
    }

    /// A pipeline across nodes fails with the node that failed, so that node too is asked last by the refresh.
    @Test func aGatherFailsWithThePartThatFailed() async throws {
        do {
            _ = try await withCheckedThrowingContinuation { continuation in
                let gather = RedisGather(parts: 3, continuation: continuation)
                gather.finish(0, .success([.integer(1)]))
                gather.finish(2, .failure(RedisError(.timeout, "no reply in time")))
                gather.finish(1, .success([.integer(2)]))
            }
            Issue.record("the gather did not fail")
        } catch let failure as RedisGather.PartFailed {
            #expect(failure.part == 2 && failure.error.code == .timeout)
        }
    }

    /// A slot map that no longer names a node drops it (a master rescheduled under a new address), so nodes and
    /// their threads do not pile up; the seeds stay.
    @Test func aNodeTheMapNoLongerNamesIsDropped() async throws {
        let client = try clusterClient()
        #expect(try await client.isCluster())
        let known = Set(client.topology.nodes.map(\.address))
        let gone = RedisAddress(host: "127.0.0.1", port: try closedPort())
        let key = try #require((0...).lazy.map { "\(freshPrefix())\($0)" }.first { RedisCluster.slot(of: $0) == 42 })
        _ = try client.topology.moved(slot: 42, to: gone) // as a master answers `MOVED 42 …` during a failover
        #expect(client.topology.nodes.contains { $0.address == gone })
        try await eventually("the refreshed map drops the node it does not name", timeout: .seconds(5)) {
            !client.topology.nodes.contains { $0.address == gone }
        }
        #expect(Set(client.topology.nodes.map(\.address)) == known)
        try await client.command(["SET", key, "1", "EX", "60"])
        #expect(try await client.command(["GET", key]).string == "1")
        try await client.command(["DEL", key])
        await client.close()
    }

    @Test func commandsWithoutAKeyGoToAnyMaster() async throws {
        let client = try clusterClient()
        #expect(try await client.command(["PING"]) == .status("PONG"))
        #expect(try await client.run(RedisScript(source: "return 7"), keys: [], args: []) == .integer(7))
        for malformed in [["EVALSHA", "abc"], ["EVAL"], ["GET"]] {
            await #expect(throws: RedisError.self) { try await client.command(malformed) }
        }
        await client.close()
    }

    @Test func standaloneNeedsNoSetting() async throws {
        let client = RedisClient(configuration: try sharedRedisConfiguration())
        let key = freshPrefix() + "plain"
        try await client.command(["SET", key, "1", "EX", "60"])
        #expect(try await client.command(["GET", key]).string == "1")
        await client.close()
    }

    @Test func aSeedThatIsDownIsPassedOver() async throws {
        try await expectServed(withFirstSeed: try closedPort())
    }

    /// A first seed that is a cluster node serving no slot (a replacement not yet joined) answers an empty slot map:
    /// the next seed is asked, rather than every call failing.
    @Test func aSeedServingNoSlotIsPassedOver() async throws {
        // Its own bus port: the default, 10,000 above a free port, may not exist.
        let fresh = try OwnRedisServer(arguments: ["--cluster-enabled", "yes", "--cluster-port", String(try closedPort())])
        try await fresh.start()
        try await expectServed(withFirstSeed: fresh.port)
        try await fresh.shutdown()
    }

    /// A client whose seeds are the one on `port`, then the test cluster's, writes and reads a key.
    private func expectServed(withFirstSeed port: Int) async throws {
        let url = try TestEnvironment.redisClusterURL()
        let schemeEnd = try #require(url.range(of: "://"))
        let client = RedisClient(configuration: try RedisConfiguration(
            url: "redis://127.0.0.1:\(port)," + url[schemeEnd.upperBound...]))
        let key = freshPrefix() + "seed"
        try await client.command(["SET", key, "1", "EX", "60"])
        #expect(try await client.command(["GET", key]).string == "1")
        #expect(try await client.masters().count == 3)
        try await client.command(["DEL", key])
        await client.close()
    }
}

func clusterAdmin(_ port: Int, _ arguments: String...) async throws -> String {
    try await runTool(["redis-cli", "-p", String(port)] + arguments).output
}

/// How many `TRYAGAIN` replies the server on `port` has given (`INFO errorstats`).
func tryAgainReplies(by port: Int) async throws -> Int {
    let stats = try await clusterAdmin(port, "INFO", "errorstats")
    guard let line = stats.split(whereSeparator: \.isNewline).first(where: { $0.hasPrefix("errorstat_TRYAGAIN:count=") })
    else { return 0 }
    return try #require(Int(line.dropFirst("errorstat_TRYAGAIN:count=".count)))
}

/// How many times the server on `port` has read from its clients' sockets (`total_reads_processed`).
func readsProcessed(by port: Int) async throws -> Int {
    let stats = try await clusterAdmin(port, "INFO", "stats")
    let line = try #require(stats.split(whereSeparator: \.isNewline).first { $0.hasPrefix("total_reads_processed:") })
    return try #require(Int(line.dropFirst("total_reads_processed:".count)))
}

func clusterClient() throws -> RedisClient {
    RedisClient(configuration: try RedisConfiguration(url: try TestEnvironment.redisClusterURL()))
}

/// The cluster's masters as the node on `port` (the first seed by default) sees them.
func clusterMasters(asSeenBy port: Int? = nil) async throws -> [ClusterMaster] {
    let firstPort = try port ?? firstSeedPort()
    return ClusterMaster.parse(clusterNodes: try await runTool(["redis-cli", "-p", String(firstPort), "CLUSTER", "NODES"]).output)
}

func firstSeedPort() throws -> Int {
    let url = try TestEnvironment.redisClusterURL()
    return try #require(url.split(separator: ",").first?.split(separator: ":").last.flatMap { Int($0) })
}

/// Every node's port, replicas included.
func clusterNodePorts() async throws -> [Int] {
    let nodes = try await runTool(["redis-cli", "-p", String(try firstSeedPort()), "CLUSTER", "NODES"]).output
    return nodes.split(separator: "\n").compactMap { line in
        line.split(separator: " ").dropFirst().first?.split(separator: "@").first?.split(separator: ":").last
            .flatMap { Int($0) }
    }
}
