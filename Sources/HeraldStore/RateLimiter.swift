import Foundation
import HeraldRedis

/// Fixed-window rate limits counted in Redis (`INCR` + `EXPIRE`), shared by every ingest instance.
///
/// A credential of one caller (a secret key, an OAuth subject) has one window. A public key ships inside every
/// copy of the app, so on device endpoints it is counted per (key, device token), each with `limit`, and also in
/// the key's app-wide ceiling (`appLimit`): one abusive device cannot lock the others out, and the whole
/// population still has a bound.
///
/// A credential's counter lives in its hash slot (`herald:{app:k:<credential>}:rl:…`), a device's in the slot of
/// the token its request writes (`herald:{app:d:<token>}:rl:…`, `a:` for a Live Activity push token). On a
/// standalone Redis a script that does a request's work counts it in the same call
/// (`SubscriptionStore.upsert(app:_:counting:now:)`): one round trip, not two. On a cluster a device's counter is
/// counted by the script that writes its token's keys, a credential's by a call of its own before the work, and a
/// public key's app-wide ceiling by each process in batches (`CeilingTally`).
public struct RateLimiter: Sendable {
    public struct Decision: Sendable, Equatable {
        public var allowed: Bool
        public var limit: Int
        public var remaining: Int
        /// Seconds until the window ends (`RateLimit-Reset`, `Retry-After`).
        public var resetSeconds: Int

        public init(allowed: Bool, limit: Int, remaining: Int, resetSeconds: Int) {
            (self.allowed, self.limit, self.remaining, self.resetSeconds) = (allowed, limit, remaining, resetSeconds)
        }
    }

    /// One counter of a window and its limit.
    public struct Counter: Sendable, Equatable {
        public var redisKey: String
        public var limit: Int
    }

    /// What one request counts in: its own counter, and for a device behind a public key the key's app-wide
    /// ceiling too. The ceiling is counted only when the request is within its own counter's limit, so requests a
    /// device has already been refused do not use up everyone's ceiling.
    public struct Window: Sendable {
        public var counter: Counter
        public var ceiling: Counter?
        /// The window's number (UNIX seconds / window length).
        public var number: Int
        /// Where a cluster counts the ceiling.
        let tally: CeilingTally
        /// `counter` is a public key's app-wide ceiling itself (`ceilingWindow`): a cluster counts it in `tally`.
        var isCeiling = false
        /// The counters' lifetime: a little longer than the window, so they outlive it on any clock.
        public var ttlSeconds: Int
        /// Seconds from now until the window ends.
        public var resetSeconds: Int

        /// The decision for the counters' values after this request's increments (`ceilingCount` 0 when the
        /// ceiling was not counted): a refusal names the counter that refused, an allowed request the counter
        /// closer to its limit.
        public func decision(count: Int64, ceilingCount: Int64 = 0) -> Decision {
            let own = decision(counter, count)
            guard own.allowed, let ceiling, ceilingCount > 0 else { return own }
            let shared = decision(ceiling, ceilingCount)
            return !shared.allowed || shared.remaining < own.remaining ? shared : own
        }

        private func decision(_ counter: Counter, _ count: Int64) -> Decision {
            Decision(allowed: count <= counter.limit, limit: counter.limit,
                     remaining: max(0, counter.limit - Int(clamping: count)), resetSeconds: resetSeconds)
        }

        /// The Redis keys the counting touches.
        public var redisKeys: [String] { [counter.redisKey] + (ceiling.map { [$0.redisKey] } ?? []) }

        /// The window without its ceiling: what a cluster counts in Redis for each request.
        var own: Window {
            var own = self
            own.ceiling = nil
            return own
        }

        /// On a cluster: counts the request in the ceiling (`CeilingTally`); its count with this request, 0 when
        /// the window has no ceiling, nil when the ceiling refuses (nothing counted).
        func claimCeiling(on redis: RedisClient) async -> Int64? {
            guard let ceiling else { return 0 }
            return await tally.claim(ceiling, window: number, ttlSeconds: ttlSeconds, redis: redis)
        }

        /// Takes back `claimCeiling`'s claim of a request its own counter refused.
        func releaseCeiling() {
            if let ceiling { tally.release(ceiling) }
        }

        /// The counts of a request the ceiling refused before its own counter was counted.
        var ceilingRefusal: (count: Int64, ceiling: Int64) { (0, Int64(ceiling?.limit ?? 0) + 1) }

        /// The script arguments of a call that counts nothing.
        public static let countingNothing = ["", "0", "0", "", "0"]

        /// The script arguments that describe the counting: counter, limit, TTL, ceiling ("" for none), its limit.
        public var scriptArguments: [String] {
            [counter.redisKey, String(counter.limit), String(ttlSeconds), ceiling?.redisKey ?? "",
             String(ceiling?.limit ?? 0)]
        }

        /// On a cluster, starts counting a request whose first write is a script in `scriptKey`'s slot: that
        /// script counts the own counter when it shares the slot (the ceiling claimed here first); otherwise a
        /// call of its own counts the window now.
        func split(beside scriptKey: String, on redis: RedisClient) async throws -> SplitCount {
            guard RedisCluster.slot(of: counter.redisKey) == RedisCluster.slot(of: scriptKey) else {
                let counts = try await RateLimiter.count(self, on: redis)
                let allowed = decision(count: counts.count, ceilingCount: counts.ceiling).allowed
                return SplitCount(window: self, inScript: nil, counts: counts, refused: !allowed)
            }
            guard let ceiling = await claimCeiling(on: redis) else {
                return SplitCount(window: self, inScript: nil, counts: ceilingRefusal, refused: true)
            }
            return SplitCount(window: self, inScript: own, counts: (0, ceiling), refused: false)
        }
    }

    /// A request's count on a cluster, split between the instance (the ceiling), a call of its own and the script
    /// that does the request's first write (`Window.split`).
    struct SplitCount {
        let window: Window
        /// What the script counts: the window's own counter, or nothing (nil).
        let inScript: Window?
        /// The counters' values after this request (with `inScript`'s count once `settle`d).
        var counts: (count: Int64, ceiling: Int64)
        /// Refused before the script: it must not run.
        let refused: Bool

        /// The script ran: its count of `inScript`, and whether that refused the request (then the ceiling's claim
        /// is taken back).
        mutating func settle(scriptCount: Int64, refused: Bool) {
            guard inScript != nil else { return }
            counts.count = scriptCount
            if refused { window.releaseCeiling() }
        }

        /// The script failed: the ceiling's claim is taken back.
        func abandon() {
            if inScript != nil { window.releaseCeiling() }
        }
    }

    let redis: RedisClient
    /// Requests per window of one credential, or of one device behind a public key.
    public let limit: Int
    /// Requests per window of one public key across all its devices.
    public let appLimit: Int
    public let windowSeconds: Int
    let tally = CeilingTally()

    public init(redis: RedisClient, limit: Int, appLimit: Int = 600_000, windowSeconds: Int = 60) {
        self.redis = redis
        self.limit = limit
        self.appLimit = appLimit
        self.windowSeconds = windowSeconds
    }

    /// The window of a request by `key` in `app` at `now`; `device` names the device when `key` is a public key
    /// on a device endpoint ("-" when the request did not say which), nil for a credential of one caller; its
    /// counter lives in `slot`. Windows are aligned to multiples of the window length, so every instance agrees on
    /// when one ends.
    public func window(for key: String, device: String? = nil, in slot: RedisKeys.DeviceCounterSlot = .deviceToken,
                       app: String, now: Date = Date()) -> Window {
        let seconds = Int(now.timeIntervalSince1970)
        let window = seconds / windowSeconds
        let keys = RedisKeys(app: app)
        let own = Counter(redisKey: keys.rateLimit(key, device: device, in: slot, window: window), limit: limit)
        let ceiling = device == nil ? nil : Counter(redisKey: keys.rateLimit(key, window: window), limit: appLimit)
        return Window(counter: own, ceiling: ceiling, number: window, tally: tally, ttlSeconds: windowSeconds + 1,
                      resetSeconds: (window + 1) * windowSeconds - seconds)
    }

    /// The window of a public key's request that names no device because it asks what every device asks alike (a
    /// post's broadcast channel): the key's app-wide ceiling alone, so the devices never share a window of `limit`.
    public func ceilingWindow(for key: String, app: String, now: Date = Date()) -> Window {
        var shared = window(for: key, device: "-", app: app, now: now)
        shared.counter = shared.ceiling!
        shared.ceiling = nil
        shared.isCeiling = true
        return shared
    }

    /// Counts one request in `window`.
    public func hit(_ window: Window) async throws -> Decision {
        let counts = try await Self.count(window, on: redis)
        return window.decision(count: counts.count, ceilingCount: counts.ceiling)
    }

    /// Where `window`'s counters stand, without counting a request: the headers of a request that a call counted
    /// before it failed (counting it again would charge it twice). On a cluster the ceiling read is the count the
    /// instances have flushed (`CeilingTally`).
    public func standing(_ window: Window) async throws -> Decision {
        let counts = try await redis.pipeline(window.redisKeys.map { ["GET", $0] }).map { $0.int ?? 0 }
        return window.decision(count: counts[0], ceilingCount: counts.count > 1 ? counts[1] : 0)
    }

    /// Counts one request in `window`; returns the counters' values after it (`ceiling` 0 when not counted).
    static func count(_ window: Window, on redis: RedisClient) async throws -> (count: Int64, ceiling: Int64) {
        if window.isCeiling, try await redis.isCluster() {
            // Every device's read would be a call to the one node holding the ceiling: counted here instead.
            let count = await window.tally.claim(window.counter, window: window.number, ttlSeconds: window.ttlSeconds,
                                                 redis: redis)
            return (count ?? Int64(window.counter.limit) + 1, 0)
        }
        guard window.ceiling != nil, try await redis.isCluster() else { return try await countInRedis(window, on: redis) }
        guard let ceiling = await window.claimCeiling(on: redis) else { return window.ceilingRefusal }
        do {
            let own = try await countInRedis(window.own, on: redis)
            guard own.count <= window.counter.limit else {
                window.releaseCeiling()
                return own
            }
            return (own.count, ceiling)
        } catch {
            window.releaseCeiling()
            throw error
        }
    }

    /// Counts one request in every counter of `window` with one script: the counters must share a slot.
    private static func countInRedis(_ window: Window, on redis: RedisClient) async throws -> (count: Int64, ceiling: Int64) {
        let reply = try await redis.run(Self.count, keys: window.redisKeys, args: window.scriptArguments)
        guard let counts = reply.array, counts.count == 2, let count = counts[0].int, let ceiling = counts[1].int else {
            throw StoreError.unexpectedReply("rate limit")
        }
        return (count, ceiling)
    }

    /// Counts one request for `key` of `app` in the current window (a credential of one caller).
    public func hit(_ key: String, app: String, now: Date = Date()) async throws -> Decision {
        try await hit(window(for: key, app: app, now: now))
    }

    /// The Lua that counts a request, shared by every script that counts one in the same call. ARGV from `first`:
    /// counter ("" to count nothing), limit, TTL, ceiling ("" for none), ceiling's limit. Sets `count` and
    /// `ceilingCount`, and `refused` when either went over its limit.
    static func countingLua(first: Int) -> String {
        """
        local count, ceilingCount, refused = 0, 0, false
        if ARGV[\(first)] ~= '' then
          count = redis.call('INCR', ARGV[\(first)])
          -- Atomic here, so the window's first request alone needs to set the lifetime.
          if count == 1 then redis.call('EXPIRE', ARGV[\(first)], ARGV[\(first + 2)]) end
          if count > tonumber(ARGV[\(first + 1)]) then
            refused = true
          elseif ARGV[\(first + 3)] ~= '' then
            ceilingCount = redis.call('INCR', ARGV[\(first + 3)])
            if ceilingCount == 1 then redis.call('EXPIRE', ARGV[\(first + 3)], ARGV[\(first + 2)]) end
            refused = ceilingCount > tonumber(ARGV[\(first + 4)])
          end
        end
        """
    }

    /// KEYS: the counters. ARGV: `Window.scriptArguments`. Returns {count, ceilingCount}.
    static let count = RedisScript(source: countingLua(first: 1) + "\nreturn {count, ceilingCount}\n")
}
