import Foundation
import HeraldCore
import HeraldRedis
import HeraldRuntime

/// A post's iOS 18 broadcast channel in one environment, as APNs created it.
public struct BroadcastChannel: Sendable, Equatable {
    public var channelID: String
    public var environment: APNsEnvironment
    public var storagePolicy: APNsStoragePolicy
    /// RFC 3339.
    public var createdAt: String

    public init(channelID: String, environment: APNsEnvironment, storagePolicy: APNsStoragePolicy, createdAt: String) {
        (self.channelID, self.environment, self.storagePolicy, self.createdAt) =
            (channelID, environment, storagePolicy, createdAt)
    }

    /// `{channelId, environment, storagePolicy, createdAt}`: what the API answers and Redis keeps.
    public var jsonValue: JSONValue {
        .object(["channelId": .string(channelID), "environment": .string(environment.rawValue),
                 "storagePolicy": .string(storagePolicy.name), "createdAt": .string(createdAt)])
    }

    init?(_ value: JSONValue) {
        guard let id = value["channelId"]?.stringValue,
              let environment = value["environment"]?.stringValue.flatMap(APNsEnvironment.init(rawValue:)),
              let policy = value["storagePolicy"]?.stringValue.flatMap(APNsStoragePolicy.init(name:)),
              let createdAt = value["createdAt"]?.stringValue else { return nil }
        self.init(channelID: id, environment: environment, storagePolicy: policy, createdAt: createdAt)
    }
}

/// What is known of a post's channel in one environment.
public enum BroadcastChannelState: Sendable, Equatable {
    case absent
    case ready(BroadcastChannel)
    /// APNs refused to create it (`reason` is Apple's, e.g. FeatureNotEnabled) for the job `jobID` (nil: a refusal
    /// saved before refusals named their job).
    case refused(reason: String, message: String, jobID: String?)
}

/// A post's broadcast channels: `herald:{app}:bcast:<postIdHash>`, a hash with one field per environment (the
/// channel's JSON) and `<environment>:refused` while the last attempt to create it was refused. No TTL: a
/// channel lives until the post's final update or the janitor (idle posts) deletes it at APNs. The posts that
/// have channels are indexed in `herald:{app}:bcastidx` by their last create or update, for the janitor.
public struct BroadcastChannelStore: Sendable {
    let redis: RedisClient

    public init(redis: RedisClient) { self.redis = redis }

    /// How many posts a janitor call reads at once.
    public static let pageSize = 500

    /// Every channel of the post (what an update is published to).
    public func channels(app: String, postIDHash: String) async throws -> [BroadcastChannel] {
        Self.channels(in: try await redis.command(["HGETALL", RedisKeys(app: app).broadcast(postIDHash)]))
    }

    /// The channels of a post's hash as `HGETALL` answered it.
    private static func channels(in reply: RedisValue) -> [BroadcastChannel] {
        let fields = reply.fieldValues ?? [:]
        return APNsEnvironment.allCases.compactMap { environment in
            fields[environment.rawValue].flatMap { JSONValue(parsing: Array($0.utf8)) }.flatMap(BroadcastChannel.init)
        }
    }

    public func state(app: String, postIDHash: String, environment: APNsEnvironment) async throws -> BroadcastChannelState {
        let reply = try await redis.command(["HMGET", RedisKeys(app: app).broadcast(postIDHash), environment.rawValue,
                                             environment.rawValue + ":refused"])
        let values = reply.array?.map(\.string) ?? []
        if let text = values.first ?? nil, let channel = JSONValue(parsing: Array(text.utf8)).flatMap(BroadcastChannel.init) {
            return .ready(channel)
        }
        if values.count > 1, let text = values[1], let refusal = JSONValue(parsing: Array(text.utf8)) {
            return .refused(reason: refusal["reason"]?.stringValue ?? "", message: refusal["message"]?.stringValue ?? "",
                            jobID: refusal["jobId"]?.stringValue)
        }
        return .absent
    }

    /// Keeps `channel` unless the post already has one in that environment; returns the one kept (the caller
    /// deletes its own at APNs when it lost).
    public func save(app: String, postIDHash: String, _ channel: BroadcastChannel) async throws -> BroadcastChannel {
        let keys = RedisKeys(app: app)
        let key = keys.broadcast(postIDHash)
        let field = channel.environment.rawValue
        let replies = try await redis.pipeline([
            ["HSETNX", key, field, String(decoding: channel.jsonValue.encoded(), as: UTF8.self)],
            ["HDEL", key, field + ":refused"],
            ["PERSIST", key], // a refusal alone there had it expire
            ["HGET", key, field],
            ["ZADD", keys.broadcastIndex, Self.nowMilliseconds, postIDHash],
        ])
        for case .error(let message) in replies { throw RedisError(.server, message) }
        return replies[3].string.flatMap { JSONValue(parsing: Array($0.utf8)) }.flatMap(BroadcastChannel.init) ?? channel
    }

    /// Keeps APNs' refusal until the post is asked again; a post that has no channel keeps it a day (posts of an
    /// app without the capability would otherwise leave a record each, for ever: the janitor walks channels only).
    public func saveRefusal(app: String, postIDHash: String, environment: APNsEnvironment, reason: String,
                            message: String, jobID: String) async throws {
        let refusal = JSONValue.object(["reason": .string(reason), "message": .string(message), "jobId": .string(jobID)]).encoded()
        _ = try await redis.run(Self.refuse, keys: [RedisKeys(app: app).broadcast(postIDHash)],
                                args: [environment.rawValue + ":refused", String(decoding: refusal, as: UTF8.self)]
                                    + APNsEnvironment.allCases.map(\.rawValue))
    }

    /// Forgets a refusal, before asking again.
    public func clearRefusal(app: String, postIDHash: String, environment: APNsEnvironment) async throws {
        _ = try await redis.command(["HDEL", RedisKeys(app: app).broadcast(postIDHash), environment.rawValue + ":refused"])
    }

    /// Forgets `channel` (deleted at APNs, or unknown to it) unless the post has another channel in its
    /// environment by now (an answer about an old channel must not forget its successor); a post left without
    /// channels leaves the index.
    public func remove(app: String, postIDHash: String, _ channel: BroadcastChannel) async throws {
        try await forget(app: app, postIDHash: postIDHash, field: channel.environment.rawValue, channelID: channel.channelID)
    }

    /// Marks the post as in use now (a publish, a create asked again), so the janitor leaves its channels alone; a
    /// post no longer indexed (its channels just deleted) stays out.
    public func touch(app: String, postIDHash: String) async throws {
        _ = try await redis.command(["ZADD", RedisKeys(app: app).broadcastIndex, "XX", Self.nowMilliseconds, postIDHash])
    }

    /// Records that the app asks APNs for channels in `environment`: one made there whose answer was lost is
    /// found by the janitor's list of that environment even when Redis knows no channel there.
    public func markEnvironmentUsed(app: String, _ environment: APNsEnvironment) async throws {
        _ = try await redis.command(["SADD", RedisKeys(app: app).broadcastEnvironments, environment.rawValue])
    }

    /// The environments the app ever asked APNs for channels in.
    public func usedEnvironments(app: String) async throws -> Set<APNsEnvironment> {
        let names = try await redis.command(["SMEMBERS", RedisKeys(app: app).broadcastEnvironments]).strings ?? []
        return Set(names.compactMap(APNsEnvironment.init(rawValue:)))
    }

    /// When the post's channels were last made, asked for or updated (UNIX ms); nil once it has none.
    public func lastUsed(app: String, postIDHash: String) async throws -> Int64? {
        try await redis.command(["ZSCORE", RedisKeys(app: app).broadcastIndex, postIDHash]).string.flatMap { Int64($0) }
    }

    /// Posts whose channels were last made or updated before `before` (UNIX ms), oldest first, after the first
    /// `offset` of them.
    public func idlePosts(app: String, before: Int64, skipping offset: Int = 0, limit: Int) async throws -> [String] {
        let reply = try await redis.command(["ZRANGEBYSCORE", RedisKeys(app: app).broadcastIndex, "-inf", "(\(before)",
                                             "LIMIT", String(offset), String(limit)])
        return reply.array?.compactMap(\.string) ?? []
    }

    /// Takes an indexed post without channels (only refusals) out of the index; false when a channel is left.
    @discardableResult
    public func unindexIfEmpty(app: String, postIDHash: String) async throws -> Bool {
        try await forget(app: app, postIDHash: postIDHash, field: "", channelID: "")
    }

    /// True when the post has no channel left (and is out of the index).
    @discardableResult
    private func forget(app: String, postIDHash: String, field: String, channelID: String) async throws -> Bool {
        let keys = RedisKeys(app: app)
        let reply = try await redis.run(Self.forget, keys: [keys.broadcast(postIDHash), keys.broadcastIndex],
                                        args: [field, postIDHash, channelID] + APNsEnvironment.allCases.map(\.rawValue))
        return reply == .integer(1)
    }

    /// Every indexed post's channels. The index is read whole (at most Apple's 10,000 channels per environment):
    /// read by position a page at a time, a post that a publish moved to its end meanwhile would shift another past
    /// a page boundary, unread, and the janitor would take that post's channel for an orphan. A post Redis answers
    /// with an error throws, for the same reason.
    public func indexedChannels(app: String) async throws -> [(post: String, channel: BroadcastChannel)] {
        let keys = RedisKeys(app: app)
        let posts = try await redis.command(["ZRANGE", keys.broadcastIndex, "0", "-1"]).array?.compactMap(\.string) ?? []
        var found: [(post: String, channel: BroadcastChannel)] = []
        for start in stride(from: 0, to: posts.count, by: Self.pageSize) {
            let page = posts[start..<min(start + Self.pageSize, posts.count)]
            let replies = try await redis.pipeline(page.map { ["HGETALL", keys.broadcast($0)] })
            try throwFirstErrorReply(replies)
            for (post, reply) in zip(page, replies) {
                found += Self.channels(in: reply).map { (post, $0) }
            }
        }
        return found
    }

    /// Channels APNs listed that Redis does not know, by `<environment>:<channelId>`, with when each was first
    /// seen so (UNIX ms). A channel is made at APNs just before it is saved, so one sighting is not yet an orphan.
    public func orphanSightings(app: String) async throws -> [String: Int64] {
        let fields = try await redis.command(["HGETALL", RedisKeys(app: app).broadcastOrphans]).fieldValues ?? [:]
        return fields.compactMapValues { Int64($0) }
    }

    /// Records the first sighting of each of `seen`, and forgets `gone` (deleted, or known to Redis after all).
    public func updateOrphanSightings(app: String, seen: [String], gone: [String]) async throws {
        let key = RedisKeys(app: app).broadcastOrphans
        let now = Self.nowMilliseconds
        var commands = seen.map { ["HSETNX", key, $0, now] }
        if !gone.isEmpty { commands.append(["HDEL", key] + gone) }
        guard !commands.isEmpty else { return }
        for case .error(let message) in try await redis.pipeline(commands) { throw RedisError(.server, message) }
    }

    private static var nowMilliseconds: String { String(Int64(Date().timeIntervalSince1970 * 1000)) }

    /// How long a post's refusals outlive its last channel.
    static let refusalSeconds = 86_400

    /// Lua shared by `forget` and `refuse`: returns 0 while the post (KEYS[1]) has a channel in an environment
    /// whose field is one of ARGV[first...].
    private static func returnWhileAChannelIsLeft(first: Int) -> String {
        """
        for i = \(first), #ARGV do
          if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then return 0 end
        end
        """
    }

    /// KEYS: the post's channels, the index. ARGV: the environment to forget ("" for none), the post, the channel
    /// id it must hold to be forgotten, then every environment's field name. The post leaves the index once no
    /// environment has a channel (what refusals are left expire).
    static let forget = RedisScript(source: """
        if ARGV[1] ~= '' then
          local stored = redis.call('HGET', KEYS[1], ARGV[1])
          if stored and cjson.decode(stored)['channelId'] == ARGV[3] then redis.call('HDEL', KEYS[1], ARGV[1]) end
        end
        \(returnWhileAChannelIsLeft(first: 4))
        redis.call('ZREM', KEYS[2], ARGV[2])
        redis.call('EXPIRE', KEYS[1], \(refusalSeconds))
        return 1
        """)

    /// KEYS: the post's channels. ARGV: the refusal's field, the refusal, then every environment's field name. A
    /// post without a channel expires with its refusals.
    static let refuse = RedisScript(source: """
        redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
        \(returnWhileAChannelIsLeft(first: 3))
        redis.call('EXPIRE', KEYS[1], \(refusalSeconds))
        return 1
        """)
}
