import Foundation
import HeraldRedis

/// A per-key fixed-window rate limit counted in Redis (`INCR` + `EXPIRE`), shared by every ingest instance.
public struct RateLimiter: Sendable {
    public struct Decision: Sendable, Equatable {
        public var allowed: Bool
        public var limit: Int
        public var remaining: Int
        /// Seconds until the window ends (`RateLimit-Reset`, `Retry-After`).
        public var resetSeconds: Int
    }

    let redis: RedisClient
    public let limit: Int
    public let windowSeconds: Int

    public init(redis: RedisClient, limit: Int, windowSeconds: Int = 60) {
        self.redis = redis
        self.limit = limit
        self.windowSeconds = windowSeconds
    }

    /// Counts one request for `key` in the current window. Windows are aligned to multiples of the window
    /// length, so every instance agrees on when one ends.
    public func hit(_ key: String, now: Date = Date()) async throws -> Decision {
        let seconds = Int(now.timeIntervalSince1970)
        let window = seconds / windowSeconds
        let redisKey = "herald:rl:{\(key)}:\(window)"
        let replies = try await redis.pipeline([["INCR", redisKey], ["EXPIRE", redisKey, String(windowSeconds + 1)]])
        guard let count = replies.first?.int else { throw StoreError.unexpectedReply("INCR") }
        let reset = (window + 1) * windowSeconds - seconds
        return Decision(allowed: count <= limit, limit: limit, remaining: max(0, limit - Int(count)), resetSeconds: reset)
    }
}
