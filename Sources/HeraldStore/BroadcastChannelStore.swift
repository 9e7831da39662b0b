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
    /// APNs refused to create it (`reason` is Apple's, e.g. FeatureNotEnabled).
    case refused(reason: String, message: String)
}

/// A post's broadcast channels: `herald:{app}:bcast:<postIdHash>`, a hash with one field per environment (the
/// channel's JSON) and `<environment>:refused` while the last attempt to create it was refused. No TTL: a
/// channel lives until the post's final update deletes it at APNs.
public struct BroadcastChannelStore: Sendable {
    let redis: RedisClient

    public init(redis: RedisClient) { self.redis = redis }

    /// Every channel of the post (what an update is published to).
    public func channels(app: String, postIDHash: String) async throws -> [BroadcastChannel] {
        let fields = try await redis.command(["HGETALL", RedisKeys(app: app).broadcast(postIDHash)]).fieldValues ?? [:]
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
            return .refused(reason: refusal["reason"]?.stringValue ?? "", message: refusal["message"]?.stringValue ?? "")
        }
        return .absent
    }

    /// Keeps `channel` unless the post already has one in that environment; returns the one kept (the caller
    /// deletes its own at APNs when it lost).
    public func save(app: String, postIDHash: String, _ channel: BroadcastChannel) async throws -> BroadcastChannel {
        let key = RedisKeys(app: app).broadcast(postIDHash)
        let field = channel.environment.rawValue
        let replies = try await redis.pipeline([
            ["HSETNX", key, field, String(decoding: channel.jsonValue.encoded(), as: UTF8.self)],
            ["HDEL", key, field + ":refused"],
            ["HGET", key, field],
        ])
        for case .error(let message) in replies { throw RedisError(.server, message) }
        return replies[2].string.flatMap { JSONValue(parsing: Array($0.utf8)) }.flatMap(BroadcastChannel.init) ?? channel
    }

    public func saveRefusal(app: String, postIDHash: String, environment: APNsEnvironment, reason: String,
                            message: String) async throws {
        let refusal = JSONValue.object(["reason": .string(reason), "message": .string(message)]).encoded()
        _ = try await redis.command(["HSET", RedisKeys(app: app).broadcast(postIDHash), environment.rawValue + ":refused",
                                     String(decoding: refusal, as: UTF8.self)])
    }

    /// Forgets a refusal, before asking again.
    public func clearRefusal(app: String, postIDHash: String, environment: APNsEnvironment) async throws {
        _ = try await redis.command(["HDEL", RedisKeys(app: app).broadcast(postIDHash), environment.rawValue + ":refused"])
    }

    /// Forgets one channel (deleted at APNs, or unknown to it).
    public func remove(app: String, postIDHash: String, environment: APNsEnvironment) async throws {
        _ = try await redis.command(["HDEL", RedisKeys(app: app).broadcast(postIDHash), environment.rawValue])
    }
}
