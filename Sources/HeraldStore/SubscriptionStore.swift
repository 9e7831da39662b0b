// Over 400 lines: one model (a subscription: upsert, list, the removals and the sweep, the fan-out read) whose cross-slot steps and their ordering rules must be read together.
import Foundation
import HeraldCore
import HeraldRedis
import HeraldRuntime

/// Device subscriptions in Redis: upsert with rotation, list and removal for ingest; batched channel reads and
/// token removal for the dispatcher. A subscription's record and its device's index share the device's hash slot;
/// the channel index (which holds each subscription's push target, `ChannelTarget.encoded`, beside its id) and the
/// expiry index live in other slots, so on a Redis Cluster an app spreads over every master (`RedisKeys`).
///
/// On a standalone Redis, where every key is on one server, an upsert and a removal are each one script. On a
/// cluster, writes that span slots are ordered so that a crash between their steps never has a push go to a
/// subscription that was removed: an upsert writes the record first and the channel index entry last; a removal
/// takes the channel index entry first and the record last. A removal keeps a record written since it read it (an
/// upsert racing the removal wins), and upserts and removals that overlap end with a channel entry exactly when
/// there is a record (see `remove`). A step a crash left undone is repaired by the next write of the same
/// subscription.
///
/// State per device is bounded (`maxPerDevice`), subscriptions end (`ttl` after their last upsert, swept by
/// `expire`, skipped by readers meanwhile), and removals of many subscriptions go in batches of `batchSize`.
public struct SubscriptionStore: Sendable {
    let redis: RedisClient
    /// A subscription not renewed for this long receives nothing and is removed; nil: never.
    public let ttl: Duration?
    /// Subscriptions one device token may have; a new one past it is refused.
    public let maxPerDevice: Int
    /// Entries one call removes or looks at, so no call holds Redis long.
    public let batchSize: Int

    public init(redis: RedisClient, ttl: Duration? = .seconds(90 * 86_400), maxPerDevice: Int = 500, batchSize: Int = 500) {
        (self.redis, self.ttl, self.maxPerDevice, self.batchSize) = (redis, ttl, maxPerDevice, batchSize)
    }

    /// Creates or updates the subscription for (token, tokenType, channel); with `previousToken`, then removes
    /// every subscription of that token with the same tokenType. `created` is false for an update.
    public func upsert(app: String, _ input: SubscriptionInput, now: Date = Date()) async throws
        -> (subscription: Subscription, created: Bool) {
        let outcome = try await run(app: app, input, counting: nil, now: now)
        switch outcome.result {
        case .stored(let subscription, let created): return (subscription, created)
        case .tooMany: throw StoreError.tooManySubscriptions(maxPerDevice)
        case .rateLimited: throw StoreError.unexpectedReply("upsert")
        }
    }

    /// What a counted upsert did.
    public enum CountedUpsert: Sendable, Equatable {
        /// Within the limit: stored (`created` false for an update).
        case stored(Subscription, created: Bool, RateLimiter.Decision)
        /// Over the limit: nothing was stored.
        case rateLimited(RateLimiter.Decision)
        /// A new subscription the device has no room for (`maxPerDevice`): nothing was stored.
        case tooMany(RateLimiter.Decision)
    }

    enum Result {
        case stored(Subscription, created: Bool)
        case rateLimited
        case tooMany
    }

    /// `upsert(app:_:now:)` that first counts the request in `window` and stores only within the limit (on a
    /// standalone Redis in the same script: the request's one Redis round trip).
    public func upsert(app: String, _ input: SubscriptionInput, counting window: RateLimiter.Window,
                       now: Date = Date()) async throws -> CountedUpsert {
        let outcome = try await run(app: app, input, counting: window, now: now)
        let decision = window.decision(count: outcome.counts.count, ceilingCount: outcome.counts.ceiling)
        switch outcome.result {
        case .stored(let subscription, let created): return .stored(subscription, created: created, decision)
        case .rateLimited: return .rateLimited(decision)
        case .tooMany: return .tooMany(decision)
        }
    }

    /// Counts, writes the record, then the channel and expiry index entries, then rotates the previous token away.
    private func run(app: String, _ input: SubscriptionInput, counting window: RateLimiter.Window?, now: Date)
        async throws -> (result: Result, counts: (count: Int64, ceiling: Int64)) {
        let keys = RedisKeys(app: app)
        let id = RedisKeys.identifier(input.deviceToken, input.tokenType.rawValue, input.channel)
        let stamp = Timestamp.rfc3339(now), updatedMs = String(Int64(now.timeIntervalSince1970 * 1000))
        let metadata = input.encodedMetadata.map { String(decoding: $0, as: UTF8.self) } ?? ""
        let expiresAt = ttl.map { Int64(now.timeIntervalSince1970) + $0.components.seconds }
        let target = ChannelTarget(deviceToken: input.deviceToken, tokenType: input.tokenType,
                                   environment: input.environment, activityID: input.activityID,
                                   expiresAt: expiresAt).encoded
        let member = id + input.deviceToken
        let record = keys.subscription(id, token: input.deviceToken), device = keys.device(input.deviceToken)
        let isCluster = try await redis.isCluster()
        var touched = [record, device, keys.removedVersions(input.deviceToken)]
        // What the script counts: everything on a standalone Redis; on a cluster what `split` leaves it.
        var split: RateLimiter.SplitCount?
        if !isCluster {
            touched += [keys.channel(input.channel), keys.subscriptionExpiry(id: id)]
            if let window { touched += window.redisKeys }
        } else if let window {
            let started = try await window.split(beside: record, on: redis)
            guard !started.refused else { return (.rateLimited, started.counts) }
            if let inScript = started.inScript { touched += inScript.redisKeys }
            split = started
        }
        let counting = isCluster ? split?.inScript : window
        let reply: RedisValue
        do {
            reply = try await redis.run(Scripts.upsert, keys: touched,
                args: [id, input.channel, input.deviceToken, input.tokenType.rawValue, input.environment.rawValue,
                       input.activityID ?? "", metadata, stamp, updatedMs, target,
                       expiresAt.map(String.init) ?? "", String(maxPerDevice), member, isCluster ? "0" : "1"]
                    + (counting?.scriptArguments ?? RateLimiter.Window.countingNothing))
        } catch {
            split?.abandon()
            throw error
        }
        guard let parts = reply.array, parts.count == 5, let created = parts[0].int, let createdAt = parts[1].string,
              let count = parts[2].int, let ceiling = parts[3].int, let version = parts[4].string else {
            throw StoreError.unexpectedReply("upsert")
        }
        split?.settle(scriptCount: count, refused: created == -1)
        let counted = split?.counts ?? (count, ceiling)
        guard created >= 0 else { return (created == -2 ? .tooMany : .rateLimited, counted) }
        if isCluster {
            // Last, so a push never finds an entry whose record was not written.
            try await index(keys, [Indexed(id: id, token: input.deviceToken, channel: input.channel, target: target,
                                           updatedMs: version, expiresAt: expiresAt)], onlyWhereMissing: false)
        }
        if let previous = input.previousToken, previous != input.deviceToken {
            _ = try await removeToken(app: app, deviceToken: previous, only: nil, tokenType: input.tokenType, keepAfterMs: nil)
        }
        let subscription = Subscription(id: id, channel: input.channel, deviceToken: input.deviceToken,
                                        tokenType: input.tokenType, environment: input.environment,
                                        activityID: input.activityID, metadata: input.metadata,
                                        createdAt: createdAt, updatedAt: stamp)
        return (.stored(subscription, created: created == 1), counted)
    }

    /// One page of a device token's subscriptions, in id order: at most `limit`, those after the subscription id
    /// `after` (the previous page's last). `next` is the id to continue after, nil on the last page. Expired
    /// subscriptions not yet swept are left out.
    public func list(app: String, deviceToken: String, after: String? = nil, limit: Int = 100,
                     now: Date = Date()) async throws -> (subscriptions: [Subscription], next: String?) {
        let keys = RedisKeys(app: app)
        // Ids only (24 hex digits each, at most `maxPerDevice` of them for a device within its cap): only the
        // page's records are read.
        var ids = (try await redis.command(["SMEMBERS", keys.device(deviceToken)]).strings ?? []).sorted()
        if let after { ids = Array(ids.drop { $0 <= after }) }
        let page = Array(ids.prefix(limit))
        let subscriptions = try await load(keys: keys, token: deviceToken, ids: page, now: now)
        return (subscriptions, ids.count > limit ? page.last : nil)
    }

    /// Removes one subscription (channel + tokenType) or all of the device's; returns how many went.
    public func remove(app: String, _ removal: SubscriptionRemoval) async throws -> Int {
        if let channel = removal.channel, let tokenType = removal.tokenType {
            let id = RedisKeys.identifier(removal.deviceToken, tokenType.rawValue, channel)
            return try await removeToken(app: app, deviceToken: removal.deviceToken, only: (id, channel),
                                         tokenType: nil, keepAfterMs: nil)
        }
        return try await removeToken(app: app, deviceToken: removal.deviceToken, only: nil, tokenType: nil, keepAfterMs: nil)
    }

    /// Removes a token APNs reported invalid: all its subscriptions, except those updated after
    /// `keepUpdatedAfter` (a 410's timestamp: the device registered again since). Returns how many went.
    public func removeInvalidToken(app: String, deviceToken: String, keepUpdatedAfter: Date? = nil) async throws -> Int {
        try await removeToken(app: app, deviceToken: deviceToken, only: nil, tokenType: nil,
                              keepAfterMs: keepUpdatedAfter.map { Int64($0.timeIntervalSince1970 * 1000) })
    }

    /// Removes the token's subscriptions: the one (`only`, whose channel index entry goes even when its record is
    /// gone), or all of them batch by batch (`SSCAN` of the device index) of `tokenType` when set, keeping those
    /// updated after `keepAfterMs`. Returns how many records went.
    private func removeToken(app: String, deviceToken: String, only: (id: String, channel: String)?,
                             tokenType: TokenType?, keepAfterMs: Int64?) async throws -> Int {
        let keys = RedisKeys(app: app), device = keys.device(deviceToken)
        var cursor = "0", removed = 0
        repeat {
            var ids: [String]
            if let only { ids = [only.id] } else {
                let page = try await redis.command(["SSCAN", device, cursor, "COUNT", String(batchSize)])
                guard let parts = page.array, parts.count == 2, let next = parts[0].string, let members = parts[1].strings else {
                    throw StoreError.unexpectedReply("SSCAN")
                }
                (cursor, ids) = (next, members)
            }
            guard !ids.isEmpty else { continue }
            let records = try await redis.pipeline(ids.map {
                ["HMGET", keys.subscription($0, token: deviceToken), "channel", "updatedMs", "tokenType"]
            })
            try throwFirstErrorReply(records) // an error is no missing record: its index entry stays
            var doomed: [Removal] = [], stale: [String] = []
            for (id, record) in zip(ids, records) {
                guard let fields = record.array, fields.count == 3, let channel = fields[0].string,
                      let updatedMs = fields[1].string else {
                    if let only { doomed.append(Removal(id: id, token: deviceToken, channel: only.channel, updatedMs: "")) }
                    else { stale.append(id) }
                    continue
                }
                if let tokenType, fields[2].string != tokenType.rawValue { continue }
                if let keepAfterMs, (Int64(updatedMs) ?? 0) > keepAfterMs { continue }
                doomed.append(Removal(id: id, token: deviceToken, channel: channel, updatedMs: updatedMs))
            }
            if !stale.isEmpty { try await redis.command(["SREM", device] + stale) }
            removed += try await remove(keys, doomed)
        } while cursor != "0"
        return removed
    }

    /// Removes every subscription of a channel (a closed channel), batch by batch (`HSCAN` of its index); a
    /// subscription written again after the removal began is kept. Returns how many went. Cancelled (a request
    /// past its deadline), it stops between batches: what went went whole, and calling again finishes it.
    public func removeChannel(app: String, channel: String, now: Date = Date()) async throws -> Int {
        let keys = RedisKeys(app: app), index = keys.channel(channel)
        let began = Int64(now.timeIntervalSince1970 * 1000)
        var cursor = "0", removed = 0
        repeat {
            try Task.checkCancellation()
            let page = try await redis.command(["HSCAN", index, cursor, "COUNT", String(batchSize)])
            guard let parts = page.array, parts.count == 2, let next = parts[0].string, let flat = parts[1].array,
                  flat.count % 2 == 0 else { throw StoreError.unexpectedReply("HSCAN") }
            cursor = next
            var entries: [(id: String, token: String)] = [], unreadable: [String] = []
            for i in stride(from: 0, to: flat.count, by: 2) {
                guard let id = flat[i].string else { continue }
                if case .bulk(let bytes) = flat[i + 1], let target = ChannelTarget(encoded: bytes) {
                    entries.append((id, target.deviceToken))
                } else {
                    unreadable.append(id)
                }
            }
            if !unreadable.isEmpty { try await redis.command(["HDEL", index] + unreadable) }
            guard !entries.isEmpty else { continue }
            let records = try await redis.pipeline(entries.map {
                ["HGET", keys.subscription($0.id, token: $0.token), "updatedMs"]
            })
            var doomed: [Removal] = []
            for (entry, record) in zip(entries, records) {
                let updatedMs = record.string ?? ""
                if let written = Int64(updatedMs), written > began { continue }
                doomed.append(Removal(id: entry.id, token: entry.token, channel: channel, updatedMs: updatedMs))
            }
            removed += try await remove(keys, doomed)
        } while cursor != "0"
        return removed
    }

    /// Removes the app's subscriptions whose expiry has passed, a batch per call of each expiry index until none
    /// is left; returns how many went. A record or index Redis answers with an error (a key of another type) is
    /// passed over so the rest are swept all the same; the sweep then throws `SweepIncomplete`, which says so.
    public func expire(app: String, now: Date = Date()) async throws -> Int {
        let keys = RedisKeys(app: app)
        let nowSeconds = Int64(now.timeIntervalSince1970)
        var removed = 0, failure: (any Error)?
        for bucket in 0..<RedisKeys.expiryBuckets {
            do {
                let (bucketRemoved, unreadable) = try await expire(keys.subscriptionExpiry(bucket: bucket), keys: keys,
                                                                   nowSeconds: nowSeconds)
                removed += bucketRemoved
                if failure == nil, let unreadable { failure = unreadable }
            } catch let error as RedisError where error.isAboutTheData {
                failure = failure ?? error // about this index's data: the other indexes are swept all the same
            }
        }
        if let failure { throw SweepIncomplete(removed: removed, error: failure) }
        return removed
    }

    /// One expiry index's due entries: how many subscriptions went, and the error of the first entry left unread.
    private func expire(_ index: String, keys: RedisKeys, nowSeconds: Int64) async throws -> (Int, RedisError?) {
        var removed = 0, unreadable = 0, firstUnreadable: RedisError?
        while true {
            // Entries left unread stay first in line: read past them.
            let members = try await redis.command(["ZRANGEBYSCORE", index, "-inf", String(nowSeconds), "LIMIT",
                                                   String(unreadable), String(batchSize)]).strings ?? []
            guard !members.isEmpty else { break }
            // `<id><token>`: the id is 24 hex digits.
            let parsed = members.map { member in
                (member: member, id: String(member.prefix(24)), token: String(member.dropFirst(24)))
            }
            let records = try await redis.pipeline(parsed.map {
                ["HMGET", keys.subscription($0.id, token: $0.token), "channel", "updatedMs", "expiresAt"]
            })
            var doomed: [Removal] = [], gone: [String] = [], renewed: [String] = []
            for (entry, record) in zip(parsed, records) {
                if case .error(let message) = record {
                    unreadable += 1
                    firstUnreadable = firstUnreadable ?? RedisError.fromReply(message)
                    continue
                }
                guard let fields = record.array, fields.count == 3, let channel = fields[0].string,
                      let updatedMs = fields[1].string else {
                    gone.append(entry.member)
                    continue
                }
                let expiresAt = fields[2].string ?? ""
                if expiresAt.isEmpty {
                    gone.append(entry.member) // written since without an expiry (the TTL was turned off)
                } else if let seconds = Int64(expiresAt), seconds > nowSeconds {
                    renewed += [expiresAt, entry.member] // its score is its expiry again
                } else {
                    doomed.append(Removal(id: entry.id, token: entry.token, channel: channel, updatedMs: updatedMs))
                }
            }
            // Only while still due: an upsert since the read gave the entry a later expiry, and keeps it.
            if !gone.isEmpty {
                try throwFirstErrorReply(await redis.run(Scripts.unindexExpiredEntry, calls: gone.map {
                    ([index], [$0, String(nowSeconds)])
                }))
            }
            if !renewed.isEmpty { try await redis.command(["ZADD", index] + renewed) }
            removed += try await remove(keys, doomed, expiredBy: nowSeconds)
            if members.count < batchSize { break }
        }
        return (removed, firstUnreadable)
    }

    /// A sweep that removed `removed` subscriptions but had to pass over a record or an index: `error` is
    /// Redis's answer about the first.
    public struct SweepIncomplete: Error, CustomStringConvertible {
        public var removed: Int
        public var error: any Error
        public var description: String {
            "\(removed) removed; some expired subscriptions could not be read and were left: \(error)"
        }
    }

    /// A subscription to remove, as read.
    struct Removal {
        var id: String
        var token: String
        var channel: String
        /// The record's `updatedMs` when read ("" when it was missing).
        var updatedMs: String
    }

    /// Removes subscriptions read as `doomed` from the channel and expiry indexes and their records and device
    /// index entries, keeping those written since they were read. Returns how many records went. The sweep passes
    /// `expiredBy` (UNIX seconds): on a cluster only index entries whose expiry has passed then go, so a
    /// subscription renewed after the sweep read it keeps being pushed to.
    ///
    /// On a standalone Redis each removal is one script. On a cluster the index entries go first (from then on
    /// nothing is pushed to the subscription), marking the version read as removed so that an upsert of it still
    /// on its way to the channel index does not put its entry back; then the records; then a record written since
    /// it was read gets back the channel entry the first step may have taken.
    func remove(_ keys: RedisKeys, _ doomed: [Removal], expiredBy now: Int64? = nil) async throws -> Int {
        guard !doomed.isEmpty else { return 0 }
        guard try await redis.isCluster() else {
            let replies = try await redis.run(Scripts.removeSubscription, calls: doomed.map {
                ([keys.subscription($0.id, token: $0.token), keys.device($0.token), keys.channel($0.channel),
                  keys.subscriptionExpiry(id: $0.id)], [$0.id, $0.updatedMs, $0.id + $0.token])
            })
            try throwFirstErrorReply(replies)
            return replies.reduce(0) { $0 + Int($1.int ?? 0) }
        }
        let lifetime = String(3 * RedisKeys.removalSpan) // of removal markers and removed versions
        if let now {
            try throwFirstErrorReply(await redis.run(Scripts.unindexExpiredTarget, calls: doomed.map {
                ([keys.channel($0.channel)], [$0.id, String(now)])
            }))
            try throwFirstErrorReply(await redis.run(Scripts.unindexExpiredEntry, calls: doomed.map {
                ([keys.subscriptionExpiry(id: $0.id)], [$0.id + $0.token, String(now)])
            }))
        } else {
            let bucket = Int64(Date().timeIntervalSince1970) / RedisKeys.removalSpan
            var unindex: [[String]] = []
            unindex.reserveCapacity(doomed.count * 2)
            for removal in doomed {
                unindex.append(Scripts.unindexTarget.call(
                    keys: [keys.channel(removal.channel), keys.channelRemovals(removal.channel, bucket: bucket)],
                    args: [removal.id, removal.updatedMs, lifetime]))
                unindex.append(["ZREM", keys.subscriptionExpiry(id: removal.id), removal.id + removal.token])
            }
            try throwFirstErrorReply(await redis.pipeline(unindex, running: Scripts.unindexTarget))
        }
        let replies = try await redis.run(Scripts.removeRecord, calls: doomed.map {
            ([keys.subscription($0.id, token: $0.token), keys.device($0.token), keys.removedVersions($0.token)],
             [$0.id, $0.updatedMs, lifetime])
        })
        try throwFirstErrorReply(replies)
        var removed = 0, kept: [Indexed] = []
        for (removal, reply) in zip(doomed, replies) {
            if let count = reply.int { removed += Int(count) }
            guard let fields = reply.array?.map(\.string), fields.count == 5,
                  let tokenType = fields[0].flatMap(TokenType.init(rawValue:)),
                  let environment = fields[1].flatMap(APNsEnvironment.init(rawValue:)),
                  let updatedMs = fields[4] else { continue }
            let expiresAt = fields[3].flatMap { Int64($0) }
            let target = ChannelTarget(deviceToken: removal.token, tokenType: tokenType, environment: environment,
                                       activityID: fields[2].flatMap { $0.isEmpty ? nil : $0 }, expiresAt: expiresAt)
            kept.append(Indexed(id: removal.id, token: removal.token, channel: removal.channel, target: target.encoded,
                                updatedMs: updatedMs, expiresAt: expiresAt))
        }
        try await index(keys, kept, onlyWhereMissing: true)
        return removed
    }

    /// A subscription's channel and expiry index entries, as a cluster upsert writes them.
    struct Indexed {
        var id: String
        var token: String
        var channel: String
        /// `ChannelTarget.encoded`.
        var target: String
        /// The record's `updatedMs`: the version a removal may have marked removed.
        var updatedMs: String
        var expiresAt: Int64?
    }

    /// Writes the channel index entries (`Scripts.indexTarget`: not of a version a removal marked; with
    /// `onlyWhereMissing`, not over an entry a later upsert wrote) and the expiry index entries, in one pipeline.
    func index(_ keys: RedisKeys, _ entries: [Indexed], onlyWhereMissing: Bool) async throws {
        guard !entries.isEmpty else { return }
        let bucket = Int64(Date().timeIntervalSince1970) / RedisKeys.removalSpan
        var commands: [[String]] = []
        commands.reserveCapacity(entries.count * 2)
        for entry in entries {
            commands.append(Scripts.indexTarget.call(
                keys: [keys.channel(entry.channel)] + (bucket - 1...bucket + 1).map { keys.channelRemovals(entry.channel, bucket: $0) },
                args: [entry.id, entry.target, entry.updatedMs, onlyWhereMissing ? "1" : "0"]))
            let expiry = keys.subscriptionExpiry(id: entry.id), member = entry.id + entry.token
            commands.append(entry.expiresAt.map { ["ZADD", expiry, String($0), member] } ?? ["ZREM", expiry, member])
        }
        try throwFirstErrorReply(await redis.pipeline(commands, running: Scripts.indexTarget))
    }

    /// One batch of a channel's subscribers, as much of each as a push needs: `HSCAN` of the channel index from
    /// `cursor` ("0" to start), whose values are the targets themselves (see `ChannelTarget`), so a batch is one
    /// command whatever its size, with no read per subscriber. The next cursor is "0" when the channel is done;
    /// memory stays bounded by `count` whatever the channel's size (a small index, which Redis keeps as a
    /// listpack, comes whole in one reply). `server` names the Redis process that gave the cursor (see
    /// `Scripts.scanPage`): the next batch must come from the same one, or the scan starts again.
    public func channelBatch(app: String, channel: String, cursor: String, count: Int = 500, now: Date = Date()) async throws
        -> (cursor: String, targets: [ChannelTarget], server: String?) {
        let nowSeconds = Int64(now.timeIntervalSince1970)
        let reply = try await redis.run(Scripts.scanPage, keys: [RedisKeys(app: app).channel(channel)],
                                        args: ["HSCAN", cursor, String(count)])
        // Read straight from the reply's bytes: the ids are not needed, and a String per field would be most of
        // a fan-out's cost here.
        guard let page = Scripts.page(reply), case .array(let fields) = page.items, fields.count % 2 == 0 else {
            throw StoreError.unexpectedReply("HSCAN")
        }
        // An entry not in `ChannelTarget.encoded`'s form (written by hand, say) is skipped rather than thrown: a
        // throw here would have the fan-out retry the same batch forever and hold up its partition.
        var targets: [ChannelTarget] = []
        targets.reserveCapacity(fields.count / 2)
        var index = 1
        while index < fields.count {
            // An expired subscription the sweep has not removed yet receives nothing.
            if case .bulk(let bytes) = fields[index], let target = ChannelTarget(encoded: bytes),
               (target.expiresAt ?? .max) > nowSeconds {
                targets.append(target)
            }
            index += 2
        }
        return (page.cursor, targets, page.server)
    }

    private func load(keys: RedisKeys, token: String, ids: [String], now: Date) async throws -> [Subscription] {
        guard !ids.isEmpty else { return [] }
        let nowSeconds = Int64(now.timeIntervalSince1970)
        let replies = try await redis.pipeline(ids.map { ["HGETALL", keys.subscription($0, token: token)] })
        try throwFirstErrorReply(replies)
        return replies.compactMap { reply in
            guard let fields = reply.fieldValues,
                  (fields["expiresAt"].flatMap { Int64($0) } ?? .max) > nowSeconds else { return nil }
            return Self.decode(fields)
        }
    }

    static func decode(_ fields: [String: String]) -> Subscription? {
        guard let id = fields["id"], let channel = fields["channel"], let token = fields["deviceToken"],
              let tokenType = fields["tokenType"].flatMap(TokenType.init(rawValue:)),
              let environment = fields["environment"].flatMap(APNsEnvironment.init(rawValue:)),
              let createdAt = fields["createdAt"], let updatedAt = fields["updatedAt"] else { return nil }
        let activityID = fields["activityID"].flatMap { $0.isEmpty ? nil : $0 }
        let metadata = fields["metadata"].flatMap { $0.isEmpty ? nil : JSONValue(parsing: Array($0.utf8)) }
        return Subscription(id: id, channel: channel, deviceToken: token, tokenType: tokenType,
                            environment: environment, activityID: activityID, metadata: metadata,
                            createdAt: createdAt, updatedAt: updatedAt)
    }
}
