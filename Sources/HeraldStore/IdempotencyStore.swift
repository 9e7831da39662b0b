import HeraldRedis

/// Producer idempotency: a client-supplied id publishes at most once within a window (24 h by default).
///
/// `claim` marks the id before publishing; `complete` records success; `release` frees the id again when
/// publishing failed, so the client's retry can publish. A claim names its claimer (a request's own random
/// value), and only that claimer's release frees it: a late release cannot free another request's claim.
public struct IdempotencyStore: Sendable {
    public enum Claim: Sendable, Equatable {
        /// The id is new: publish, then `complete` or `release`.
        case claimed
        /// Already published: answer with the same job id, publish nothing.
        case alreadyPublished
        /// Another request with this id is publishing right now.
        case inProgress
    }

    let redis: RedisClient
    public let window: Duration
    /// How long an unfinished claim blocks retries if its request died before `release`; longer than a publish
    /// may wait for the broker, or a retry would publish beside it.
    public let claimTimeout: Duration

    public init(redis: RedisClient, window: Duration = .seconds(86_400), claimTimeout: Duration = .seconds(30)) {
        self.redis = redis
        self.window = window
        self.claimTimeout = claimTimeout
    }

    /// Claims `id` for a new publication by `claimer`. A claimed id starts with no job status: the status of an
    /// earlier job of the same id (kept longer than this window) must not stand for the new one. Redis refusing
    /// the write (`OOM`, `READONLY`) throws, rather than reading as another request's claim.
    public func claim(app: String, id: String, by claimer: String) async throws -> Claim {
        let keys = RedisKeys(app: app)
        let reply = try await redis.run(Self.claimScript, keys: [keys.idempotency(id), keys.jobStatus(id)],
                                        args: [String(max(1, claimTimeout.components.seconds)), claimer])
        switch reply.string {
        case "claimed": return .claimed
        case "published": return .alreadyPublished
        default: return .inProgress
        }
    }

    /// KEYS: the id's marker, the job's status (one slot: the app's). ARGV: the claim's TTL in seconds, the claimer.
    static let claimScript = RedisScript(source: """
        if redis.call('SET', KEYS[1], 'pending:' .. ARGV[2], 'NX', 'EX', ARGV[1]) then
          redis.call('DEL', KEYS[2])
          return 'claimed'
        end
        return redis.call('GET', KEYS[1]) or ''
        """)

    public func complete(app: String, id: String) async throws {
        _ = try await redis.command(["SET", RedisKeys(app: app).idempotency(id), "published", "EX",
                                     String(window.components.seconds)])
    }

    /// Frees `id` if `claimer` still holds it.
    public func release(app: String, id: String, by claimer: String) async throws {
        _ = try await redis.run(Self.releaseScript, keys: [RedisKeys(app: app).idempotency(id)], args: [claimer])
    }

    /// KEYS: the id's marker. ARGV: the claimer.
    static let releaseScript = RedisScript(source: """
        if redis.call('GET', KEYS[1]) == 'pending:' .. ARGV[1] then return redis.call('DEL', KEYS[1]) end
        return 0
        """)
}
