import HeraldCore
import HeraldRedis
import HeraldRuntime

/// Where a fan-out has got to, kept in Redis so that a dispatcher that restarts (or takes over the partition)
/// resumes there instead of from the first subscriber, and skips the pushes it already delivered.
///
/// Key: `herald:fanout:{<group>}:<topic>:<partition>:<offset>`, a hash per job record (a re-delivered record finds
/// its own): `cursor` — the scan cursor up to which every push is settled; `d:<token>` — a push delivered past
/// that cursor; `done` — the whole fan-out settled (kept an hour, for a record that runs again before its offset
/// was committed). It expires after `ttl` otherwise.
struct FanOutProgress: Sendable {
    let redis: RedisClient
    let group: String
    let ttl: Duration

    struct Saved: Sendable {
        var done = false
        var cursor = "0"
        /// Tokens delivered past `cursor`.
        var delivered: Set<String> = []
    }

    func key(_ source: DeadLetter.Source) -> String {
        "herald:fanout:{\(group)}:\(source.topic):\(source.partition):\(source.offset)"
    }

    func load(_ source: DeadLetter.Source) async throws -> Saved {
        guard case .array(let fields) = try await redis.command(["HGETALL", key(source)]) else { return Saved() }
        var saved = Saved()
        var index = 0
        while index + 1 < fields.count {
            let field = fields[index].string ?? "", value = fields[index + 1].string ?? ""
            index += 2
            if field == "done" { saved.done = true }
            else if field == "cursor" { saved.cursor = value }
            else if field.hasPrefix("d:") { saved.delivered.insert(String(field.dropFirst(2))) }
        }
        return saved
    }

    /// Records pushes as delivered (one write for all of them).
    func delivered(_ source: DeadLetter.Source, tokens: [String]) async throws {
        guard !tokens.isEmpty else { return }
        var set = ["HSET", key(source)]
        set.reserveCapacity(2 + 2 * tokens.count)
        for token in tokens { set += ["d:" + token, ""] }
        try await write(source, [set])
    }

    /// Moves the settled cursor, forgetting the delivered pushes it now covers.
    func advance(_ source: DeadLetter.Source, cursor: String, covering tokens: [String]) async throws {
        var commands = [["HSET", key(source), "cursor", cursor]]
        if !tokens.isEmpty { commands.append(["HDEL", key(source)] + tokens.map { "d:" + $0 }) }
        try await write(source, commands)
    }

    func markDone(_ source: DeadLetter.Source) async throws {
        try await write(source, [["DEL", key(source)], ["HSET", key(source), "done", "1"]], expiringIn: .seconds(3600))
    }

    /// Runs `commands` and renews the record's TTL (`ttl`, or `expiringIn` when shorter), in one pipeline.
    private func write(_ source: DeadLetter.Source, _ commands: [[String]], expiringIn limit: Duration? = nil) async throws {
        let seconds = max(1, min(ttl, limit ?? ttl).components.seconds)
        let replies = try await redis.pipeline(commands + [["EXPIRE", key(source), String(seconds)]])
        for case .error(let message) in replies { throw RedisError(.server, message) }
    }
}

/// Records a fan-out's delivered pushes in few writes: pushes delivered while a write is under way go in the next
/// one. `record` returns once its tokens are written (or the write failed and was logged), and the caller holds
/// the pushes' slots until then, so the pushes a crash can send twice are never more than those in flight.
final class DeliveredPushes: Sendable {
    private struct State {
        var pending: [String] = []
        var waiting: [CheckedContinuation<Void, Never>] = []
        var writing = false
    }

    private let progress: FanOutProgress
    private let source: DeadLetter.Source
    private let logger: Logger
    private let state = Lock(State())

    init(progress: FanOutProgress, source: DeadLetter.Source, logger: Logger) {
        self.progress = progress
        self.source = source
        self.logger = logger
    }

    func record(_ tokens: [String]) async {
        guard !tokens.isEmpty else { return }
        // Not cancellable: a revoked job's delivered pushes are recorded all the same, for the next owner.
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let startWriting = state.withLock { s -> Bool in
                s.pending += tokens
                s.waiting.append(continuation)
                guard !s.writing else { return false }
                s.writing = true
                return true
            }
            if startWriting { Task { await self.writeAll() } }
        }
    }

    private func writeAll() async {
        while true {
            let (tokens, waiting) = state.withLock { s -> ([String], [CheckedContinuation<Void, Never>]) in
                defer { s.pending = []; s.waiting = [] }
                if s.waiting.isEmpty { s.writing = false }
                return (s.pending, s.waiting)
            }
            guard !waiting.isEmpty else { return }
            do { try await progress.delivered(source, tokens: tokens) } catch {
                logger.warning("cannot record delivered pushes; a restart would send them again",
                               ["error": "\(error)", "pushes": "\(tokens.count)"])
            }
            for continuation in waiting { continuation.resume() }
        }
    }
}
