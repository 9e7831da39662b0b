import Foundation
import HeraldCore
import HeraldRedis
import HeraldRuntime

/// Device subscriptions in Redis: upsert with rotation, list and removal for ingest; batched channel reads and
/// token removal for the dispatcher. Each change is one Lua script, so a subscription and its indexes never
/// disagree: the channel index holds each subscription's push target (`ChannelTarget.encoded`) beside its id, and
/// every script that writes or removes a subscription writes or removes that entry too.
public struct SubscriptionStore: Sendable {
    let redis: RedisClient

    public init(redis: RedisClient) { self.redis = redis }

    /// Creates or updates the subscription for (token, tokenType, channel); with `previousToken`, first removes
    /// every subscription of that token with the same tokenType. `created` is false for an update.
    public func upsert(app: String, _ input: SubscriptionInput, now: Date = Date()) async throws
        -> (subscription: Subscription, created: Bool) {
        let outcome = try await run(app: app, input, counting: nil, now: now)
        guard let stored = outcome.stored else { throw StoreError.unexpectedReply("upsert") }
        return stored
    }

    /// What a counted upsert did.
    public enum CountedUpsert: Sendable, Equatable {
        /// Within the limit: stored (`created` false for an update).
        case stored(Subscription, created: Bool, RateLimiter.Decision)
        /// Over the limit: nothing was stored.
        case rateLimited(RateLimiter.Decision)
    }

    /// `upsert(app:_:now:)` that first counts the request in `window` and stores only within the limit, in the
    /// same script: the request's one Redis round trip.
    public func upsert(app: String, _ input: SubscriptionInput, counting window: RateLimiter.Window,
                       now: Date = Date()) async throws -> CountedUpsert {
        let outcome = try await run(app: app, input, counting: window, now: now)
        let decision = window.decision(count: outcome.counts.count, ceilingCount: outcome.counts.ceiling)
        guard let stored = outcome.stored else { return .rateLimited(decision) }
        return .stored(stored.subscription, created: stored.created, decision)
    }

    /// Runs the upsert script; `stored` is nil when the count went over the window's limit.
    private func run(app: String, _ input: SubscriptionInput, counting window: RateLimiter.Window?, now: Date)
        async throws -> (stored: (subscription: Subscription, created: Bool)?, counts: (count: Int64, ceiling: Int64)) {
        let keys = RedisKeys(app: app)
        let id = RedisKeys.identifier(input.deviceToken, input.tokenType.rawValue, input.channel)
        let stamp = Timestamp.rfc3339(now)
        let metadata = input.encodedMetadata.map { String(decoding: $0, as: UTF8.self) } ?? ""
        let previous = input.previousToken.flatMap { $0 == input.deviceToken ? nil : $0 } ?? ""
        var touched = [keys.subscription(id), keys.channel(input.channel), keys.device(input.deviceToken)]
        if !previous.isEmpty { touched.append(keys.device(previous)) }
        if let window { touched += window.redisKeys }
        let reply = try await redis.run(Scripts.upsert, keys: touched,
            args: [keys.prefix, id, input.channel, input.deviceToken, input.tokenType.rawValue,
                   input.environment.rawValue, input.activityID ?? "", metadata, stamp,
                   String(Int64(now.timeIntervalSince1970 * 1000)), previous,
                   ChannelTarget(deviceToken: input.deviceToken, tokenType: input.tokenType,
                                 environment: input.environment, activityID: input.activityID).encoded]
                + (window?.scriptArguments ?? RateLimiter.Window.countingNothing))
        guard let parts = reply.array, parts.count == 4, let created = parts[0].int, let createdAt = parts[1].string,
              let count = parts[2].int, let ceiling = parts[3].int else {
            throw StoreError.unexpectedReply("upsert")
        }
        guard created >= 0 else { return (nil, (count, ceiling)) }
        let subscription = Subscription(id: id, channel: input.channel, deviceToken: input.deviceToken,
                                        tokenType: input.tokenType, environment: input.environment,
                                        activityID: input.activityID, metadata: input.metadata,
                                        createdAt: createdAt, updatedAt: stamp)
        return ((subscription, created == 1), (count, ceiling))
    }

    /// Every subscription of a device token.
    public func list(app: String, deviceToken: String) async throws -> [Subscription] {
        let keys = RedisKeys(app: app)
        let ids = try await redis.command(["SMEMBERS", keys.device(deviceToken)]).strings ?? []
        return try await load(keys: keys, ids: ids.sorted())
    }

    /// Removes one subscription (channel + tokenType) or all of the device's; returns how many went.
    public func remove(app: String, _ removal: SubscriptionRemoval) async throws -> Int {
        let keys = RedisKeys(app: app)
        let only = removal.channel.flatMap { channel in
            removal.tokenType.map { RedisKeys.identifier(removal.deviceToken, $0.rawValue, channel) }
        } ?? ""
        let reply = try await redis.run(Scripts.removeToken, keys: [keys.device(removal.deviceToken)],
                                        args: [keys.prefix, removal.deviceToken, only, "", ""])
        return Int(reply.int ?? 0)
    }

    /// Removes a token APNs reported invalid: all its subscriptions, except those updated after
    /// `keepUpdatedAfter` (a 410's timestamp: the device registered again since). Returns how many went.
    public func removeInvalidToken(app: String, deviceToken: String, keepUpdatedAfter: Date? = nil) async throws -> Int {
        let keys = RedisKeys(app: app)
        let cutoff = keepUpdatedAfter.map { String(Int64($0.timeIntervalSince1970 * 1000)) } ?? ""
        let reply = try await redis.run(Scripts.removeToken, keys: [keys.device(deviceToken)],
                                        args: [keys.prefix, deviceToken, "", cutoff, ""])
        return Int(reply.int ?? 0)
    }

    /// One batch of a channel's subscribers, as much of each as a push needs: `HSCAN` of the channel index from
    /// `cursor` ("0" to start), whose values are the targets themselves (see `ChannelTarget`), so a batch is one
    /// command whatever its size, with no read per subscriber. The next cursor is "0" when the channel is done;
    /// memory stays bounded by `count` whatever the channel's size (a small index, which Redis keeps as a
    /// listpack, comes whole in one reply).
    public func channelBatch(app: String, channel: String, cursor: String, count: Int = 500) async throws
        -> (cursor: String, targets: [ChannelTarget]) {
        let reply = try await redis.command(["HSCAN", RedisKeys(app: app).channel(channel), cursor, "COUNT", String(count)])
        // Read straight from the reply's bytes: the ids are not needed, and a String per field would be most of
        // a fan-out's cost here.
        guard case .array(let parts) = reply, parts.count == 2, let next = parts[0].string,
              case .array(let fields) = parts[1], fields.count % 2 == 0 else {
            throw StoreError.unexpectedReply("HSCAN")
        }
        // An entry not in `ChannelTarget.encoded`'s form (written by hand, say) is skipped rather than thrown: a
        // throw here would have the fan-out retry the same batch forever and hold up its partition.
        var targets: [ChannelTarget] = []
        targets.reserveCapacity(fields.count / 2)
        var index = 1
        while index < fields.count {
            if case .bulk(let bytes) = fields[index], let target = ChannelTarget(encoded: bytes) {
                targets.append(target)
            }
            index += 2
        }
        return (next, targets)
    }

    private func load(keys: RedisKeys, ids: [String]) async throws -> [Subscription] {
        guard !ids.isEmpty else { return [] }
        let replies = try await redis.pipeline(ids.map { ["HGETALL", keys.subscription($0)] })
        return replies.compactMap { reply in reply.fieldValues.flatMap(Self.decode) }
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

/// What a channel fan-out needs of one subscription.
public struct ChannelTarget: Sendable, Equatable {
    public var deviceToken: String
    public var tokenType: TokenType
    public var environment: APNsEnvironment
    /// The Live Activity a `liveactivity-update` subscription is for, if it names one.
    public var activityID: String?

    public init(deviceToken: String, tokenType: TokenType, environment: APNsEnvironment, activityID: String?) {
        (self.deviceToken, self.tokenType, self.environment, self.activityID) =
            (deviceToken, tokenType, environment, activityID)
    }

    /// The channel index's value for this subscription: one letter for the token type (`a` alert, `s`
    /// liveactivity-start, `u` liveactivity-update), one for the environment (`p` production, `s` sandbox), the
    /// token (hex), then `:` and the activityID when there is one. The token is hex, so the first `:` ends it and
    /// the activityID (any text) is the rest, whatever it holds.
    var encoded: String {
        var text = ""
        text.reserveCapacity(3 + deviceToken.utf8.count + (activityID?.utf8.count ?? 0))
        text.unicodeScalars.append(Unicode.Scalar(Self.code(of: tokenType)))
        text.unicodeScalars.append(Unicode.Scalar(environment == .production ? UInt8(ascii: "p") : UInt8(ascii: "s")))
        text += deviceToken
        if let activityID {
            text += ":"
            text += activityID
        }
        return text
    }

    /// From `encoded`'s bytes; nil when they are not in that form.
    init?(encoded bytes: [UInt8]) {
        guard bytes.count > 2 else { return nil }
        let tokenType: TokenType
        switch bytes[0] {
        case UInt8(ascii: "a"): tokenType = .alert
        case UInt8(ascii: "s"): tokenType = .liveActivityStart
        case UInt8(ascii: "u"): tokenType = .liveActivityUpdate
        default: return nil
        }
        let environment: APNsEnvironment
        switch bytes[1] {
        case UInt8(ascii: "p"): environment = .production
        case UInt8(ascii: "s"): environment = .sandbox
        default: return nil
        }
        let separator = bytes[2...].firstIndex(of: UInt8(ascii: ":")) ?? bytes.endIndex
        guard separator > 2 else { return nil }
        let activityID = separator + 1 < bytes.endIndex
            ? String(decoding: bytes[(separator + 1)...], as: UTF8.self) : nil
        self.init(deviceToken: String(decoding: bytes[2..<separator], as: UTF8.self), tokenType: tokenType,
                  environment: environment, activityID: activityID)
    }

    private static func code(of tokenType: TokenType) -> UInt8 {
        switch tokenType {
        case .alert: UInt8(ascii: "a")
        case .liveActivityStart: UInt8(ascii: "s")
        case .liveActivityUpdate: UInt8(ascii: "u")
        }
    }
}

public enum StoreError: Error, CustomStringConvertible {
    case unexpectedReply(String)

    public var description: String {
        switch self {
        case .unexpectedReply(let what): "unexpected Redis reply to \(what)"
        }
    }
}
