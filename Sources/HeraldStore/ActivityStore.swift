import Foundation
import HeraldCore
import HeraldRedis

/// A stored Live Activity registration. `pushToken` is a credential: API responses leave it out.
public struct ActivityRegistration: Sendable, Equatable {
    public var id: String
    public var user: String
    public var postIDHash: String
    public var pushToken: String
    public var environment: APNsEnvironment
    public var bundleID: String
    public var createdAt: String
    public var lastSeenAt: String
}

/// Live Activity push-token registrations in Redis. Each registration is a hash with a TTL that every re-post
/// renews; the post's index is a sorted set scored by expiry, so readers skip expired members. Expired members
/// are pruned whenever a registration renews the index's own TTL (once per sixtieth of the TTL on a busy post)
/// and by every batch read of their index, and an index outlives its newest member by at most a sixtieth of the
/// TTL (its own TTL), so nothing is kept once a post goes quiet.
public struct ActivityStore: Sendable {
    let redis: RedisClient
    public let ttl: Duration

    public init(redis: RedisClient, ttl: Duration = .seconds(3600)) {
        self.redis = redis
        self.ttl = ttl
    }

    /// Registers (or renews) the (user, post, token) triple; `renewed` is true when it already existed, in
    /// which case `id` and `createdAt` are kept and `lastSeenAt` moves.
    public func register(app: String, user: String, _ input: ActivityRegistrationInput, now: Date = Date()) async throws
        -> (registration: ActivityRegistration, renewed: Bool) {
        guard let stored = try await run(app: app, user: user, input, counting: nil, now: now).stored else {
            throw StoreError.unexpectedReply("register")
        }
        return stored
    }

    /// What a counted registration did.
    public enum CountedRegistration: Sendable, Equatable {
        /// Within the limit: stored (`renewed` true when it already existed).
        case stored(ActivityRegistration, renewed: Bool, RateLimiter.Decision)
        /// Over the limit: nothing was stored.
        case rateLimited(RateLimiter.Decision)
    }

    /// `register(app:user:_:now:)` that first counts the request in `window` and stores only within the limit, in
    /// the same script: the request's one Redis round trip.
    public func register(app: String, user: String, _ input: ActivityRegistrationInput,
                         counting window: RateLimiter.Window, now: Date = Date()) async throws -> CountedRegistration {
        let outcome = try await run(app: app, user: user, input, counting: window, now: now)
        let decision = window.decision(count: outcome.counts.count, ceilingCount: outcome.counts.ceiling)
        guard let stored = outcome.stored else { return .rateLimited(decision) }
        return .stored(stored.registration, renewed: stored.renewed, decision)
    }

    /// Counts, writes the token index entry, then the registration and the post index (on a standalone Redis all
    /// in one script); `stored` is nil when the count went over the window's limit. The token index (which only
    /// removal reads) is written before the post index (which pushes read), so a registration a push can reach is
    /// always one a 410 can remove.
    private func run(app: String, user: String, _ input: ActivityRegistrationInput, counting window: RateLimiter.Window?,
                     now: Date) async throws
        -> (stored: (registration: ActivityRegistration, renewed: Bool)?, counts: (count: Int64, ceiling: Int64)) {
        let keys = RedisKeys(app: app)
        let id = RedisKeys.identifier(app, user, input.postIDHash, input.pushToken)
        // The stamp is formatted from the stored milliseconds, as readers format `lastSeenMs`, so both agree.
        let nowMs = Int64((now.timeIntervalSince1970 * 1000).rounded(.down))
        let stamp = Timestamp.rfc3339(milliseconds: nowMs)
        let ttlMs = ttl.inMilliseconds
        let token = keys.activityToken(input.pushToken), member = id + input.postIDHash
        let expiry = String(nowMs + ttlMs), indexTTL = String(ttlMs + ttlMs / 60)
        var touched = [keys.registration(id, post: input.postIDHash), keys.post(input.postIDHash)]
        var counted: (count: Int64, ceiling: Int64)?
        let isCluster = try await redis.isCluster()
        // What the post's script counts: everything on a standalone Redis; on a cluster nothing (the token's
        // script counts what `split` leaves it).
        let counting = isCluster ? nil : window
        if isCluster {
            var split: RateLimiter.SplitCount?
            if let window {
                let started = try await window.split(beside: token, on: redis)
                guard !started.refused else { return (nil, started.counts) }
                split = started
            }
            let reply: RedisValue
            do {
                reply = try await redis.run(Scripts.registerToken, keys: [token] + (split?.inScript?.redisKeys ?? []),
                    args: [member, expiry, String(nowMs), String(ttlMs), indexTTL]
                        + (split?.inScript?.scriptArguments ?? RateLimiter.Window.countingNothing))
            } catch {
                split?.abandon()
                throw error
            }
            guard let parts = reply.string?.split(separator: " "), parts.count == 2, let count = Int64(parts[1]) else {
                throw StoreError.unexpectedReply("registerToken")
            }
            split?.settle(scriptCount: count, refused: parts[0] == "-")
            counted = split?.counts
            if parts[0] == "-" { return (nil, counted ?? (count, 0)) }
        } else {
            touched.append(token)
            if let window { touched += window.redisKeys }
        }
        let reply = try await redis.run(Scripts.register, keys: touched,
            args: [id, user, input.postIDHash, input.pushToken, input.environment.rawValue, input.bundleID, stamp,
                   String(nowMs), String(ttlMs), expiry, indexTTL, isCluster ? "0" : "1", member]
                + (counting?.scriptArguments ?? RateLimiter.Window.countingNothing))
        // "<what> <count> <ceilingCount>", what being + (new), - (over a limit: nothing stored) or the createdAt
        // of a renewed registration.
        guard let parts = reply.string?.split(separator: " "), parts.count == 3, let count = Int64(parts[1]),
              let ceiling = Int64(parts[2]) else {
            throw StoreError.unexpectedReply("register")
        }
        guard parts[0] != "-" else { return (nil, (count, ceiling)) }
        let createdAt = parts[0] == "+" ? nil : String(parts[0])
        let counts = counted ?? (count, ceiling)
        return ((ActivityRegistration(id: id, user: user, postIDHash: input.postIDHash, pushToken: input.pushToken,
                                      environment: input.environment, bundleID: input.bundleID,
                                      createdAt: createdAt ?? stamp, lastSeenAt: stamp), createdAt != nil), counts)
    }

    /// One batch of a post's live registrations: ZSCAN from `cursor` ("0" to start; the next cursor is "0" when
    /// done). Expired index members are pruned when a scan starts and skipped after; a registration whose hash
    /// has expired is never returned. Memory stays bounded by `count`.
    public func postBatch(app: String, postIDHash: String, cursor: String, count: Int = 500,
                          now: Date = Date()) async throws -> (cursor: String, registrations: [ActivityRegistration]) {
        let batch = try await postIDs(app: app, postIDHash: postIDHash, cursor: cursor, count: count, now: now)
        return (batch.cursor, try await registrations(app: app, postIDHash: postIDHash, ids: batch.ids))
    }

    /// The first half of `postBatch`: the ids of the post's next live registrations (ZSCAN from `cursor`, expired
    /// ones skipped; a scan from "0" first drops the expired ones), the next cursor and the Redis process that gave
    /// it (as `SubscriptionStore.channelBatch`).
    public func postIDs(app: String, postIDHash: String, cursor: String, count: Int = 500,
                        now: Date = Date()) async throws -> (cursor: String, ids: [String], server: String?) {
        let nowMs = Double(Int64(now.timeIntervalSince1970 * 1000))
        let index = RedisKeys(app: app).post(postIDHash)
        if cursor == "0" { _ = try await redis.command(["ZREMRANGEBYSCORE", index, "-inf", String(Int64(nowMs))]) }
        let reply = try await redis.run(Scripts.scanPage, keys: [index], args: ["ZSCAN", cursor, String(count)])
        guard let page = Scripts.page(reply), let flat = page.items.strings, flat.count % 2 == 0 else {
            throw StoreError.unexpectedReply("ZSCAN")
        }
        let ids = stride(from: 0, to: flat.count, by: 2).compactMap { i in
            (Double(flat[i + 1]) ?? 0) > nowMs ? flat[i] : nil
        }
        return (page.cursor, ids, page.server)
    }

    /// The second half of `postBatch`: these registrations, in one pipelined HGETALL round; ids whose
    /// registration is gone are skipped.
    public func registrations(app: String, postIDHash: String, ids: [String]) async throws -> [ActivityRegistration] {
        guard !ids.isEmpty else { return [] }
        let keys = RedisKeys(app: app)
        let hashes = try await redis.pipeline(ids.map { ["HGETALL", keys.registration($0, post: postIDHash)] })
        try throwFirstErrorReply(hashes)
        return zip(ids, hashes).compactMap { id, hash in hash.fieldValues.flatMap { Self.decode(id: id, $0) } }
    }

    /// What a fan-out needs of these registrations (token, environment, bundle id), in one pipelined `HMGET` round:
    /// three fields instead of every field as a dictionary, which made a post's update cost twice the dispatcher's
    /// CPU per push of a channel's. Ids whose registration is gone are skipped.
    public func pushTargets(app: String, postIDHash: String, ids: [String]) async throws -> [ActivityPushTarget] {
        guard !ids.isEmpty else { return [] }
        let keys = RedisKeys(app: app)
        let replies = try await redis.pipeline(ids.map {
            ["HMGET", keys.registration($0, post: postIDHash), "pushToken", "environment", "bundleId"]
        })
        try throwFirstErrorReply(replies) // an error is no gone registration: its push must not be skipped
        return replies.compactMap { reply in
            guard let fields = reply.array, fields.count == 3, let token = fields[0].string,
                  let environment = fields[1].string.flatMap(APNsEnvironment.init(rawValue:)),
                  let bundle = fields[2].string else { return nil }
            return ActivityPushTarget(pushToken: token, environment: environment, bundleID: bundle)
        }
    }

    /// Removes every registration of a post (after its final update was sent), then their token index entries,
    /// `batchSize` at a time (a post followed by a million devices must not hold Redis for seconds in one script);
    /// returns how many. Registrations made or renewed while it runs (scored past the last one it saw) are left.
    public func removePost(app: String, postIDHash: String, batchSize: Int = 500) async throws -> Int {
        let keys = RedisKeys(app: app), index = keys.post(postIDHash)
        let last = try await redis.command(["ZRANGE", index, "-1", "-1", "WITHSCORES"]).strings ?? []
        guard last.count == 2 else { return 0 }
        var total = 0
        while true {
            let ids = try await redis.command(["ZRANGE", index, "-inf", last[1], "BYSCORE", "LIMIT", "0",
                                               String(batchSize)]).strings ?? []
            guard !ids.isEmpty else { break }
            let reply = try await redis.run(Scripts.removePostBatch,
                                            keys: [index] + ids.map { keys.registration($0, post: postIDHash) }, args: ids)
            // {id, token, id, token, …} of the registrations removed.
            let removed = reply.strings ?? []
            total += removed.count / 2
            guard !removed.isEmpty else { continue }
            try throwFirstErrorReply(await redis.pipeline(stride(from: 0, to: removed.count - 1, by: 2).map {
                ["ZREM", keys.activityToken(removed[$0 + 1]), removed[$0] + postIDHash]
            }))
        }
        return total
    }

    /// Removes a push token APNs reported invalid, except registrations seen after `keepSeenAfter`: from each
    /// post first (so nothing more is pushed to it), then from the token's index.
    public func removeInvalidToken(app: String, pushToken: String, keepSeenAfter: Date? = nil) async throws -> Int {
        let keys = RedisKeys(app: app), index = keys.activityToken(pushToken)
        let cutoff = keepSeenAfter.map { String(Int64($0.timeIntervalSince1970 * 1000)) } ?? ""
        // `<id><postIdHash>` and its score: the id is 24 hex digits.
        let listed = try await redis.command(["ZRANGE", index, "0", "-1", "WITHSCORES"]).strings ?? []
        var entries: [(member: String, score: String, id: String, post: String)] = []
        for at in stride(from: 0, to: listed.count - 1, by: 2) {
            let member = listed[at]
            entries.append((member, listed[at + 1], String(member.prefix(24)), String(member.dropFirst(24))))
        }
        guard !entries.isEmpty else { return 0 }
        let replies = try await redis.run(Scripts.removeRegistration, calls: entries.map {
            ([keys.registration($0.id, post: $0.post), keys.post($0.post)], [$0.id, cutoff])
        })
        try throwFirstErrorReply(replies)
        // Each entry only as it was read: a registration made again meanwhile wrote a new score, and keeps its entry.
        // One whose registration was not there is taken only once expired: on a cluster a registration writes its
        // token entry first and the registration after, and one in between must stay removable by the next 410.
        let nowMs = Int64(Date().timeIntervalSince1970 * 1000)
        let done = zip(entries, replies).filter { entry, reply in
            reply.int == 1 || reply.int == 0 && (Int64(entry.score) ?? 0) <= nowMs
        }.map(\.0)
        if !done.isEmpty {
            try throwFirstErrorReply(await redis.run(Scripts.removeUnchangedEntry, calls: done.map { ([index], [$0.member, $0.score]) }))
        }
        return replies.reduce(0) { $0 + ($1.int == 1 ? 1 : 0) }
    }

    /// The registration `id` (its key's suffix) stored as `f`. The hash keeps the last-seen time in milliseconds
    /// only (`lastSeenAt` is formatted here), which also reads hashes written before `id` and `lastSeenAt` were
    /// dropped from them.
    static func decode(id: String, _ f: [String: String]) -> ActivityRegistration? {
        guard let user = f["user"], let post = f["postIdHash"], let token = f["pushToken"],
              let environment = f["environment"].flatMap(APNsEnvironment.init(rawValue:)), let bundle = f["bundleId"],
              let createdAt = f["createdAt"], let lastSeenMs = f["lastSeenMs"].flatMap({ Int64($0) }) else { return nil }
        return ActivityRegistration(id: id, user: user, postIDHash: post, pushToken: token, environment: environment,
                                    bundleID: bundle, createdAt: createdAt,
                                    lastSeenAt: Timestamp.rfc3339(milliseconds: lastSeenMs))
    }
}

extension Scripts {
    /// KEYS: registration, post index, then on a standalone Redis the token index and the rate-limit counters.
    /// ARGV: id, user, post, token, environment, bundle, now (RFC 3339), now (ms), ttl (ms), expiry (now + ttl,
    /// ms), index TTL (ttl + ttl/60, ms), "1" to write the token index here ("0": the caller did, before), the
    /// token index's member (`<id><postIdHash>`), then the rate-limit window's `scriptArguments` (counter "" to
    /// count nothing). Every number the script
    /// hands to Redis comes as text: a Lua number would be formatted with `%.17g` and parsed back per call (~8 % of
    /// Redis's CPU here).
    /// Returns "+ <count> <ceilingCount>" for a new registration, "- <count> <ceilingCount>" over a limit (nothing
    /// stored), and "<createdAt> <count> <ceilingCount>" for a renewal: Redis turns a string into its reply several
    /// times cheaper than a table (~5 % of the script's instructions for a new registration).
    ///
    /// The hash holds createdAt, user, postIdHash, pushToken, environment, bundleId and lastSeenMs: the id is the
    /// key's suffix and readers format lastSeenAt from lastSeenMs (each field stored costs Redis a listpack append
    /// and reallocation; the two dropped were ~5 % of the script's instructions).
    ///
    /// Each index keeps a TTL no shorter than its newest member's: it never expires under registrations that still
    /// live, even when `ttl` is lowered. The TTL is set to `ttl` plus a sixtieth of it (a minute for an hour), and
    /// renewed only once it has fallen below `ttl`; that renewal is also when the index drops its expired members.
    /// So a busy post's index is re-expired and pruned once a minute rather than by every registration, holds at
    /// most a minute's worth of expired members (readers skip them by score), and outlives its last registration
    /// by at most that minute.
    ///
    /// Redis calls, for the CPU each costs per registration (eight for a new token on a known post and for a
    /// renewal, nine when the post is new too, plus two per index once a minute): the hash's `createdAt` is read
    /// first, so one HSET writes a new registration and a renewal rewrites only the fields a re-post can change
    /// (the id is derived from user, post and token). The post index is usually known, so its PTTL is read before its ZADD. A new registration's
    /// token index is usually new, so its ZADD goes first and `PEXPIRE … NX` (Redis 7.0) both gives a new index
    /// its TTL and tells whether the index was new; only a known one needs its PTTL read. ZADD goes before
    /// ZREMRANGEBYSCORE so the index never vanishes between the two (its new member is live).
    static let register = RedisScript(source: RateLimiter.countingLua(first: 14) + """

        if refused then return '- ' .. count .. ' ' .. ceilingCount end
        local reg, post = KEYS[1], KEYS[2]
        local id, now, nowMs, ttl = ARGV[1], ARGV[7], ARGV[8], tonumber(ARGV[9])
        local createdAt = redis.call('HGET', reg, 'createdAt')
        if createdAt then
          redis.call('HSET', reg, 'environment', ARGV[5], 'bundleId', ARGV[6], 'lastSeenMs', nowMs)
        else
          redis.call('HSET', reg, 'createdAt', now, 'user', ARGV[2], 'postIdHash', ARGV[3], 'pushToken', ARGV[4],
                     'environment', ARGV[5], 'bundleId', ARGV[6], 'lastSeenMs', nowMs)
        end
        redis.call('PEXPIRE', reg, ARGV[9])
        -- An existing index is renewed and pruned once its TTL falls below `ttl` (-1: none). Written out per index:
        -- a Lua function would be a closure built by every call (~2 % of the script's instructions).
        local left = redis.call('PTTL', post)
        redis.call('ZADD', post, ARGV[10], id)
        if left == -2 then
          redis.call('PEXPIRE', post, ARGV[11])
        elseif left < ttl then
          redis.call('ZREMRANGEBYSCORE', post, '-inf', nowMs)
          redis.call('PEXPIRE', post, ARGV[11])
        end
        if ARGV[12] == '1' then
          local tok, member = KEYS[3], ARGV[13]
          if createdAt then
            left = redis.call('PTTL', tok)
            redis.call('ZADD', tok, ARGV[10], member)
          else
            redis.call('ZADD', tok, ARGV[10], member)
            -- 1: the index is new and now has its TTL (so nothing to renew); 0: it existed, with a TTL.
            left = redis.call('PEXPIRE', tok, ARGV[11], 'NX') == 1 and ttl or redis.call('PTTL', tok)
          end
          if left < ttl then
            redis.call('ZREMRANGEBYSCORE', tok, '-inf', nowMs)
            redis.call('PEXPIRE', tok, ARGV[11])
          end
        end
        if createdAt then return createdAt .. ' ' .. count .. ' ' .. ceilingCount end
        return '+ ' .. count .. ' ' .. ceilingCount
        """)

    /// KEYS: token index, then the rate-limit counter when it is in the token's slot. ARGV: member
    /// (`<id><postIdHash>`), expiry (ms), now (ms), ttl (ms), index TTL (ms), then the rate-limit window's
    /// `scriptArguments` (counter "" to count nothing).
    /// `register`'s token index step, by itself: on a cluster the token index is in another slot. Returns
    /// "+ <count>", or "- <count>" over the limit (nothing written).
    static let registerToken = RedisScript(source: RateLimiter.countingLua(first: 6) + """

        if refused then return '- ' .. count end
        local tok, ttl = KEYS[1], tonumber(ARGV[4])
        local left = redis.call('PTTL', tok)
        redis.call('ZADD', tok, ARGV[2], ARGV[1])
        if left == -2 then
          redis.call('PEXPIRE', tok, ARGV[5])
        elseif left < ttl then
          redis.call('ZREMRANGEBYSCORE', tok, '-inf', ARGV[3])
          redis.call('PEXPIRE', tok, ARGV[5])
        end
        return '+ ' .. count
        """)

    /// KEYS: post index, then the registrations of a batch of its ids. ARGV: those ids.
    /// Deletes the registrations and takes the ids out of the index; returns {id, pushToken, …} of those deleted.
    static let removePostBatch = RedisScript(source: """
        local removed = {}
        for i, id in ipairs(ARGV) do
          local token = redis.call('HGET', KEYS[i + 1], 'pushToken')
          if token then
            redis.call('DEL', KEYS[i + 1])
            removed[#removed + 1] = id
            removed[#removed + 1] = token
          end
        end
        redis.call('ZREM', KEYS[1], unpack(ARGV))
        return removed
        """)

    /// KEYS: a sorted set. ARGV: a member, its score as read. Removes the member if its score is still that.
    static let removeUnchangedEntry = RedisScript(source: """
        if redis.call('ZSCORE', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
        return redis.call('ZREM', KEYS[1], ARGV[1])
        """)

    /// KEYS: registration, post index. ARGV: id, keepAfterMs ("" for none).
    /// Removes the registration from its post unless seen after keepAfterMs. Returns 1 when removed, -1 when kept,
    /// 0 when it was gone already.
    static let removeRegistration = RedisScript(source: """
        local seen = redis.call('HGET', KEYS[1], 'lastSeenMs')
        local seenMs, keepAfter = tonumber(seen or ''), tonumber(ARGV[2])
        if seenMs and keepAfter and seenMs > keepAfter then return -1 end
        redis.call('ZREM', KEYS[2], ARGV[1])
        if not seen then return 0 end
        redis.call('DEL', KEYS[1])
        return 1
        """)
}

/// A registration as a post's fan-out reads it.
public struct ActivityPushTarget: Sendable, Equatable {
    public var pushToken: String
    public var environment: APNsEnvironment
    public var bundleID: String

    public init(pushToken: String, environment: APNsEnvironment, bundleID: String) {
        (self.pushToken, self.environment, self.bundleID) = (pushToken, environment, bundleID)
    }
}
