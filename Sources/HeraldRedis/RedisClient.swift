import Foundation
import HeraldRuntime

/// A Redis client for many concurrent tasks, for a standalone Redis or a Redis Cluster alike.
///
/// With one server every call goes to it; in a cluster (found by asking the seeds on the first call, see
/// `RedisTopology`) each command goes to the master serving its key's slot, a pipeline is split by node and its
/// replies put back in order, a `MOVED` reply is followed (and refreshes the map; a pipeline's commands that moved
/// are sent again as a pipeline), an `ASK` reply is followed once with `ASKING`, and a `TRYAGAIN` (a migrating
/// slot's keys split between two nodes) is sent again after a pause. Each server is a `RedisNode`:
/// a pool of connection threads plus one non-blocking connection per event loop, with the deadlines, reconnection
/// and error kinds described there.
///
/// A call that fails with a connection error may or may not have been executed by Redis. Cancelling the calling
/// task does not withdraw a queued call; its deadline bounds the wait. Blocking commands (`BLPOP`) hold a pooled
/// connection for their whole wait: give them a client of their own (and never call them on an event loop).
public final class RedisClient: Sendable {
    public let configuration: RedisConfiguration
    let topology: RedisTopology
    /// Redirections one call follows before it gives up (a cluster resharding under it).
    private static let maxRedirects = 5

    /// Connections open lazily, on the first call, so a client can be created while Redis is still down.
    public init(configuration: RedisConfiguration, logger: Logger = Logger(label: "herald.redis")) {
        self.configuration = configuration
        topology = RedisTopology(configuration: configuration, logger: logger)
    }

    /// Refuses new calls (they throw `.closed`), answers the queued ones, and returns when every connection thread
    /// has exited. Connections on event loops are closed by their loops' next turn.
    public func close() async {
        await topology.close()
    }

    /// Runs one command, e.g. `["SET", key, value, "EX", "60"]`.
    ///
    /// - Throws: `RedisError` — `.server`/`.noScript` for an error reply, or a connection failure.
    @discardableResult
    public func command(_ arguments: [String]) async throws -> RedisValue {
        var encoder = RESPEncoder()
        encoder.append(arguments)
        return try checked(await send(encoder) { RedisCluster.slot(of: arguments) })
    }

    /// Runs one command whose arguments are arbitrary bytes (binary keys or values).
    @discardableResult
    public func command(_ arguments: [[UInt8]]) async throws -> RedisValue {
        var encoder = RESPEncoder()
        encoder.append(arguments)
        return try checked(await send(encoder) { RedisCluster.slot(ofBytes: arguments) })
    }

    /// Sends the commands together, in order, and returns one reply per command. In a cluster the commands of
    /// each node go together, to every node at once, and one continuation waits for all the answers (no task per
    /// node: one costs more CPU than the whole call). A pipeline holding `MULTI` goes whole to its first key's node
    /// (a transaction runs on one node: its keys must share a slot).
    ///
    /// Error replies are returned in place as `RedisValue.error` so one failing command does not hide the others'
    /// replies; only connection failures throw, and `.unavailable` when Redis is not serving (`LOADING` after a
    /// restart…), which answers every command of the pipeline alike.
    @discardableResult
    public func pipeline(_ commands: [[String]]) async throws -> [RedisValue] {
        try await pipeline(commands.count, slot: { RedisCluster.slot(of: commands[$0]) },
                           isTransaction: { commands.contains { $0.first?.uppercased() == "MULTI" } },
                           encode: { $0.append(commands[$1]) })
    }

    /// `pipeline(_:)` for commands whose arguments are arbitrary bytes.
    @discardableResult
    public func pipeline(_ commands: [[[UInt8]]]) async throws -> [RedisValue] {
        try await pipeline(commands.count, slot: { RedisCluster.slot(ofBytes: commands[$0]) },
                           isTransaction: { commands.contains { $0.first.map(Self.isMulti) ?? false } },
                           encode: { $0.append(commands[$1]) })
    }

    /// `MULTI` in any case, as Redis takes it.
    private static func isMulti(_ name: [UInt8]) -> Bool {
        name.count == 5 && zip(name, "MULTI".utf8).allSatisfy { $0 & 0xDF == $1 }
    }

    /// Runs a Lua script with `EVALSHA`; when Redis does not know it yet (`NOSCRIPT`), sends it once with `EVAL`,
    /// which also caches it for later calls. In a cluster it runs on the node of its first key.
    @discardableResult
    public func run(_ script: RedisScript, keys: [String], args: [String]) async throws -> RedisValue {
        let count = String(keys.count)
        // The call's size up to a few bytes (16 covers an argument's framing). A guess of 64 per argument reserved
        // over 1 KiB for a registration, past the sizes glibc's per-thread cache serves.
        var size = 64
        for argument in keys { size += argument.utf8.count + 16 }
        for argument in args { size += argument.utf8.count + 16 }
        let slot = { keys.first.map { RedisCluster.slot(of: $0) } }
        var encoder = RESPEncoder(capacity: size + script.sha1.utf8.count)
        encoder.append(["EVALSHA", script.sha1, count], keys, args)
        do {
            return try checked(await send(encoder, slot: slot))
        } catch let error as RedisError where error.code == .noScript {
            var retry = RESPEncoder(capacity: size + script.source.utf8.count)
            retry.append(["EVAL", script.source, count], keys, args)
            return try checked(await send(retry, slot: slot))
        }
    }

    /// Runs the script once per call, pipelined (`EVALSHA`; a call its node does not know the script for is sent
    /// again by itself with `EVAL`). Error replies come back in place, as with `pipeline(_:)`.
    public func run(_ script: RedisScript, calls: [(keys: [String], args: [String])]) async throws -> [RedisValue] {
        try await pipeline(calls.map { script.call(keys: $0.keys, args: $0.args) }, running: script)
    }

    /// `pipeline(_:)` of commands among which are calls of `script` (`RedisScript.call`): a call its node does not
    /// know the script for yet is sent again by itself with `EVAL`.
    public func pipeline(_ commands: [[String]], running script: RedisScript) async throws -> [RedisValue] {
        var replies = try await pipeline(commands)
        for index in replies.indices {
            let command = commands[index]
            if case .error(let message) = replies[index], RedisError.fromReply(message).code == .noScript,
               command.count >= 3, command[1] == script.sha1, let keyCount = Int(command[2]) {
                replies[index] = try await run(script, keys: Array(command[3..<3 + keyCount]),
                                               args: Array(command[(3 + keyCount)...]))
            }
        }
        return replies
    }

    /// Whether the servers are a Redis Cluster (asking the seeds first when no call has yet): a caller whose keys
    /// span hash slots does in one script on a standalone Redis what takes several calls on a cluster.
    public func isCluster() async throws -> Bool {
        if case .cluster = try await topology.route(settled: true) { return true }
        return false
    }

    /// One server holding keys: a standalone Redis, or a cluster master.
    public struct Master: Sendable {
        let node: RedisNode
        let client: RedisClient
        /// `host:port`, for messages.
        public var address: String { node.configuration.description }

        /// Runs a command on this server alone (`SCAN`, `DBSIZE`), whatever its keys.
        public func command(_ arguments: [String]) async throws -> RedisValue {
            var encoder = RESPEncoder()
            encoder.append(arguments)
            return try client.checked(await client.reply(to: encoder, from: node, asking: false))
        }
    }

    /// The servers holding keys now, each once: for walking every key (`SCAN` on each).
    public func masters() async throws -> [Master] {
        topology.masters(on: try await topology.route(settled: true)).map { Master(node: $0, client: self) }
    }

    /// How many event loops hold a connection of this client, over all its nodes (for tests and diagnostics).
    public var loopConnectionCount: Int { topology.nodes.reduce(0) { $0 + $1.loopConnectionCount } }

    /// One command to its node, following redirections. `slot` is only asked in a cluster.
    private func send(_ encoder: RESPEncoder, slot: () -> Int?) async throws -> RedisValue {
        let route = try await topology.route()
        switch route {
        case .standalone(let node): return try await send(encoder, to: node, asking: false, redirections: 0)
        case .cluster:
            guard let slot = slot() else { return try await anyMaster(encoder, on: route) }
            return try await send(encoder, to: try topology.node(for: slot, on: route), asking: false, redirections: 0)
        }
    }

    /// One command to `node`, following its redirections up to `maxRedirects` counting the `redirections` already
    /// met by the call.
    private func send(_ encoder: RESPEncoder, to node: RedisNode, asking: Bool,
                      redirections: Int) async throws -> RedisValue {
        var (node, asking) = (node, asking)
        var trail: [String] = [] // the redirections met, for the error
        for attempt in redirections..<Self.maxRedirects {
            try await pauseBeforeRedirection(attempt)
            let reply = try await reply(to: encoder, from: node, asking: asking)
            guard case .error(let message) = reply, let redirect = RedisCluster.Redirect(reply, asked: node.address)
            else { return reply }
            trail.append("\(node.configuration.description): \(message)")
            switch redirect {
            case .moved(let slot, let address): (node, asking) = (try topology.moved(slot: slot, to: address), false)
            case .ask(_, let address): (node, asking) = (try topology.node(at: address), true)
            case .tryAgain: if attempt < Self.maxRedirects - 1 { try await pauseForMigration() }
            }
        }
        throw tooManyRedirections(trail)
    }

    /// Nodes may disagree for a moment while a slot changes hands: past the second redirection, give the cluster a
    /// few milliseconds more each time (at most 140 ms in all).
    private func pauseBeforeRedirection(_ attempt: Int) async throws {
        if attempt >= 2 { try await Task.sleep(for: .milliseconds(20 * (attempt - 1))) }
    }

    /// `TRYAGAIN`: while a slot migrates, a command whose keys are not all on the node asked (some moved already,
    /// or not written yet) is refused until the slot has moved. Waited out longer than other redirections (50 ms
    /// each time; with theirs, at most 320 ms over a call's attempts) before the call answers `unavailable`.
    private func pauseForMigration() async throws {
        try await Task.sleep(for: .milliseconds(50))
    }

    private func tooManyRedirections(_ trail: [String]) -> RedisError {
        RedisError(.unavailable, "CLUSTERDOWN more than \(Self.maxRedirects) redirections for one command"
                   + (trail.isEmpty ? "" : " (" + trail.joined(separator: "; ") + ")"))
    }

    /// A command without a key (`PING` for readiness, `SCRIPT`): the first master that answers, so one master
    /// failing over does not make the whole cluster look down. A command that timed out may have run, and is sent
    /// to the next master all the same: only for commands that may run twice (Herald sends no other).
    private func anyMaster(_ encoder: RESPEncoder, on route: RedisTopology.Route) async throws -> RedisValue {
        var lastError = RedisError(.unavailable, "CLUSTERDOWN no node serves any slot")
        for node in topology.masters(on: route) {
            do { return try await reply(to: encoder, from: node, asking: false) } catch let error as RedisError
                where error.isConnectionFailure {
                lastError = error
            }
        }
        throw lastError
    }

    fileprivate func reply(to encoder: RESPEncoder, from node: RedisNode, asking: Bool) async throws -> RedisValue {
        do {
            guard asking else { return try await node.single(encoder) }
            var asked = RESPEncoder(capacity: encoder.bytes.count + 16)
            asked.append(["ASKING"])
            asked.append(encoded: encoder)
            return try await node.many(asked).last ?? .null
        } catch let error as RedisError {
            topology.callFailed(error, on: node.address)
            throw error
        }
    }

    private func pipeline(_ count: Int, slot: (Int) -> Int?, isTransaction: () -> Bool,
                          encode: (inout RESPEncoder, Int) -> Void) async throws -> [RedisValue] {
        guard count > 0 else { return [] }
        var (replies, nodes) = try await sendByNode(Array(0..<count), slot: slot, isTransaction: isTransaction,
                                                    encode: encode)
        // A transaction fails whole, but its MOVED still says where the slot went; other commands whose slot moved
        // (or is moving) are sent again where the redirections say: those that moved, or were told to try again,
        // together as a pipeline again; those asked elsewhere one by one.
        guard replies.contains(where: { RedisCluster.Redirect($0) != nil }) else { return replies }
        guard !isTransaction() else {
            for (reply, node) in zip(replies, nodes) {
                switch RedisCluster.Redirect(reply, asked: node.address) {
                case .moved(let slot, let address)?: _ = try? topology.moved(slot: slot, to: address)
                // Nothing of it ran (EXECABORT): the caller may send it again, as after `LOADING`.
                case .tryAgain?: throw RedisError.fromReply(reply.errorMessage ?? "TRYAGAIN")
                case .ask?, nil: break
                }
            }
            return replies
        }
        for attempt in 0..<Self.maxRedirects - 1 {
            var resend: [Int] = [], migrating = false
            for index in replies.indices {
                switch RedisCluster.Redirect(replies[index], asked: nodes[index].address) {
                case .moved(let slot, let address)?:
                    _ = try topology.moved(slot: slot, to: address)
                    resend.append(index)
                case .tryAgain?:
                    resend.append(index)
                    migrating = true
                case .ask(_, let address)?:
                    var encoder = RESPEncoder()
                    encode(&encoder, index)
                    replies[index] = try await send(encoder, to: try topology.node(at: address), asking: true,
                                                    redirections: attempt + 1)
                case nil: break
                }
            }
            guard !resend.isEmpty else { return replies }
            try await pauseBeforeRedirection(attempt + 1)
            if migrating { try await pauseForMigration() }
            let (again, againNodes) = try await sendByNode(resend, slot: slot, isTransaction: { false }, encode: encode)
            for (position, index) in resend.enumerated() {
                (replies[index], nodes[index]) = (again[position], againNodes[position])
            }
        }
        if let index = replies.firstIndex(where: { RedisCluster.Redirect($0) != nil }),
           case .error(let message) = replies[index] {
            throw tooManyRedirections(["\(nodes[index].configuration.description): \(message)"])
        }
        return replies
    }

    /// Sends the commands at `indices`, each node's together, to every node at once; returns, by position in
    /// `indices`, each reply and the node that gave it. A transaction goes whole to its first key's node (a
    /// transaction runs on one node: its keys must share a slot). While a single seed is still being asked whether
    /// it is a cluster, it is called as a standalone Redis and may redirect some of them.
    private func sendByNode(_ indices: [Int], slot: (Int) -> Int?, isTransaction: () -> Bool,
                      encode: (inout RESPEncoder, Int) -> Void) async throws -> ([RedisValue], [RedisNode]) {
        let route = try await topology.route()
        var groups: [(node: RedisNode, positions: [Int])] = []
        switch route {
        case .standalone(let node): groups = [(node, Array(indices.indices))]
        case .cluster where isTransaction():
            groups = [(try topology.node(for: indices.lazy.compactMap(slot).first, on: route), Array(indices.indices))]
        case .cluster:
            for (position, index) in indices.enumerated() {
                let node = try topology.node(for: slot(index), on: route)
                if let group = groups.firstIndex(where: { $0.node === node }) {
                    groups[group].positions.append(position)
                } else {
                    groups.append((node, [position]))
                }
            }
        }
        let batches = groups.map { group in
            var encoder = RESPEncoder(capacity: group.positions.count * 32)
            for position in group.positions { encode(&encoder, indices[position]) }
            return (group.node, encoder)
        }
        if groups.count == 1 {
            return (try throwingUnavailability(await many(batches[0].1, on: batches[0].0)),
                    Array(repeating: groups[0].node, count: indices.count))
        }
        var replies = [RedisValue](repeating: .null, count: indices.count)
        var nodes = [RedisNode](repeating: groups[0].node, count: indices.count)
        for (group, nodeReplies) in zip(groups, try await many(batches)) {
            for (position, reply) in zip(group.positions, nodeReplies) {
                (replies[position], nodes[position]) = (reply, group.node)
            }
        }
        return (try throwingUnavailability(replies), nodes)
    }

    /// The replies, unless Redis answered that it is not serving (`LOADING`…), which answers every command alike
    /// (not `TRYAGAIN`, about one command's keys: `pipeline` sends those again).
    private func throwingUnavailability(_ replies: [RedisValue]) throws -> [RedisValue] {
        if let unavailable = replies.lazy.filter({ RedisCluster.Redirect($0) == nil })
            .compactMap(RedisError.unavailability(of:)).first {
            topology.callFailed(unavailable)
            throw unavailable
        }
        return replies
    }

    private func many(_ encoder: RESPEncoder, on node: RedisNode) async throws -> [RedisValue] {
        do { return try await node.many(encoder) } catch let error as RedisError {
            topology.callFailed(error, on: node.address)
            throw error
        }
    }

    /// Each node's commands, sent to every node at once (no task per node), and each node's replies in order.
    private func many(_ batches: [(node: RedisNode, encoder: RESPEncoder)]) async throws -> [[RedisValue]] {
        do {
            return try await withCheckedThrowingContinuation { continuation in
                let gather = RedisGather(parts: batches.count, continuation: continuation)
                for (index, batch) in batches.enumerated() { batch.node.submit(batch.encoder, completion: .part(gather, index)) }
            }
        } catch let failure as RedisGather.PartFailed {
            topology.callFailed(failure.error, on: batches[failure.part].node.address)
            throw failure.error
        }
    }

    fileprivate func checked(_ reply: RedisValue) throws(RedisError) -> RedisValue {
        if case .error(let message) = reply {
            let error = RedisError.fromReply(message)
            if error.code == .unavailable { topology.callFailed(error) }
            throw error
        }
        return reply
    }
}
