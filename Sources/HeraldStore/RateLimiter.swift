import Foundation
import HeraldRedis

/// A per-key fixed-window rate limit counted in Redis (`INCR` + `EXPIRE`), shared by every ingest instance.
///
/// The counter lives in the app's hash slot (`herald:{app}:rl:<key>:<window>`), so a script that does a request's
/// work can count it in the same call (`SubscriptionStore.upsert(app:_:counting:now:)`): one round trip, not two.
public struct RateLimiter: Sendable {
    public struct Decision: Sendable, Equatable {
        public var allowed: Bool
        public var limit: Int
        public var remaining: Int
        /// Seconds until the window ends (`RateLimit-Reset`, `Retry-After`).
        public var resetSeconds: Int
    }

    /// One key's current window: the counter to increment and how to read its new value.
    public struct Window: Sendable, Equatable {
        /// The Redis counter.
        public var redisKey: String
        public var limit: Int
        /// The counter's lifetime: a little longer than the window, so it outlives it on any clock.
        public var ttlSeconds: Int
        /// Seconds from now until the window ends.
        public var resetSeconds: Int

        /// The decision for the counter's value after this request's increment.
        public func decision(count: Int64) -> Decision {
            Decision(allowed: count <= limit, limit: limit, remaining: max(0, limit - Int(clamping: count)),
                     resetSeconds: resetSeconds)
        }
    }

    let redis: RedisClient
    public let limit: Int
    public let windowSeconds: Int

    public init(redis: RedisClient, limit: Int, windowSeconds: Int = 60) {
        self.redis = redis
        self.limit = limit
        self.windowSeconds = windowSeconds
    }

    /// `key`'s window in `app` at `now`. Windows are aligned to multiples of the window length, so every instance
    /// agrees on when one ends.
    public func window(for key: String, app: String, now: Date = Date()) -> Window {
        let seconds = Int(now.timeIntervalSince1970)
        let window = seconds / windowSeconds
        return Window(redisKey: RedisKeys(app: app).rateLimit(key, window: window), limit: limit,
                      ttlSeconds: windowSeconds + 1, resetSeconds: (window + 1) * windowSeconds - seconds)
    }

    /// Counts one request for `key` of `app` in the current window.
    public func hit(_ key: String, app: String, now: Date = Date()) async throws -> Decision {
        let window = window(for: key, app: app, now: now)
        let replies = try await redis.pipeline([["INCR", window.redisKey],
                                                ["EXPIRE", window.redisKey, String(window.ttlSeconds)]])
        guard let count = replies.first?.int else { throw StoreError.unexpectedReply("INCR") }
        return window.decision(count: count)
    }
}
