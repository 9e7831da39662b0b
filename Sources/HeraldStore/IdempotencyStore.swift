import HeraldRedis

/// Producer idempotency: a client-supplied id publishes at most once within a window (24 h by default).
///
/// `claim` marks the id before publishing; `complete` records success; `release` frees the id again when
/// publishing failed, so the client's retry can publish.
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
    /// How long an unfinished claim blocks retries if its request died before `release`.
    public let claimTimeout: Duration

    public init(redis: RedisClient, window: Duration = .seconds(86_400), claimTimeout: Duration = .seconds(30)) {
        self.redis = redis
        self.window = window
        self.claimTimeout = claimTimeout
    }

    public func claim(app: String, id: String) async throws -> Claim {
        let key = RedisKeys(app: app).idempotency(id)
        let reply = try await redis.pipeline([
            ["SET", key, "pending", "NX", "EX", String(claimTimeout.components.seconds)],
            ["GET", key],
        ])
        if reply[0].string == "OK" { return .claimed }
        return reply[1].string == "published" ? .alreadyPublished : .inProgress
    }

    public func complete(app: String, id: String) async throws {
        _ = try await redis.command(["SET", RedisKeys(app: app).idempotency(id), "published", "EX",
                                     String(window.components.seconds)])
    }

    public func release(app: String, id: String) async throws {
        _ = try await redis.command(["DEL", RedisKeys(app: app).idempotency(id)])
    }
}
