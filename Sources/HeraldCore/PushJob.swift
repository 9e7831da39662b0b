import Foundation
import HeraldAPNsCore
import HeraldCrypto
import HeraldRuntime

/// One message on `herald.jobs` (schemas/push-job.schema.json, version 1): what to send, to whom.
///
/// Ingest builds jobs from events; any producer may write them directly, so the dispatcher decodes and calls
/// `validate()` on every job before acting on it.
public struct PushJob: Sendable, Equatable {
    public static let currentVersion = 1

    /// Who a job is for: every subscriber of a channel, every Live Activity registered for a post, one device,
    /// or one broadcast channel (replays of a failed broadcast).
    public enum Target: Sendable, Equatable {
        case channel(String)
        /// A post's `postIdHash`.
        case post(String)
        case device(Device)
        case broadcast(Broadcast)

        public enum Kind: String, Sendable, CaseIterable { case channel, post, device, broadcast }

        public struct Device: Sendable, Equatable {
            /// Lowercase hex (it is part of the record key).
            public var token: String
            public var tokenType: TokenType
            /// Absent means production.
            public var environment: APNsEnvironment?
            /// The `apns-topic`, when not the app's bundle id (replays of Live Activity pushes).
            public var topic: String?
        }

        /// An iOS 18 broadcast channel, as APNs made it.
        public struct Broadcast: Sendable, Equatable {
            public var channelId: String
            public var environment: APNsEnvironment
            public var storagePolicy: APNsStoragePolicy

            public init(channelId: String, environment: APNsEnvironment, storagePolicy: APNsStoragePolicy) {
                (self.channelId, self.environment, self.storagePolicy) = (channelId, environment, storagePolicy)
            }
        }

        public static func device(_ token: String, tokenType: TokenType, environment: APNsEnvironment?,
                                  topic: String? = nil) -> Target {
            .device(Device(token: token, tokenType: tokenType, environment: environment, topic: topic))
        }

        public var kind: Kind {
            switch self {
            case .channel: .channel
            case .post: .post
            case .device: .device
            case .broadcast: .broadcast
            }
        }

        public var channel: String? { if case .channel(let name) = self { name } else { nil } }
        public var postIdHash: String? { if case .post(let hash) = self { hash } else { nil } }
        public var deviceToken: String? { if case .device(let device) = self { device.token } else { nil } }
        public var tokenType: TokenType? { if case .device(let device) = self { device.tokenType } else { nil } }
        public var environment: APNsEnvironment? { if case .device(let device) = self { device.environment } else { nil } }
        /// Device targets only; setting it on another kind does nothing.
        public var topic: String? {
            get { if case .device(let device) = self { device.topic } else { nil } }
            set { if case .device(var device) = self { device.topic = newValue; self = .device(device) } }
        }

        public var jsonValue: JSONValue {
            switch self {
            case .channel(let name):
                return .object(["kind": .string("channel"), "channel": .string(name)])
            case .post(let hash):
                return .object(["kind": .string("post"), "postIdHash": .string(hash)])
            case .device(let device):
                var fields: [String: JSONValue] = ["kind": .string("device"), "deviceToken": .string(device.token),
                                                   "tokenType": .string(device.tokenType.rawValue)]
                fields["environment"] = device.environment.map { .string($0.rawValue) }
                fields["topic"] = device.topic.map { .string($0) }
                return .object(fields)
            case .broadcast(let broadcast):
                return .object(["kind": .string("broadcast"), "channelId": .string(broadcast.channelId),
                                "environment": .string(broadcast.environment.rawValue),
                                "storagePolicy": .string(broadcast.storagePolicy.name)])
            }
        }
    }

    /// A Live Activity `update` or `end`.
    public struct LiveActivity: Sendable, Equatable {
        public enum Event: String, Sendable, CaseIterable { case update, end }
        public var event: Event
        public var contentState: JSONValue
        public var alert: JSONValue?
        public var staleDate: Int64?
        public var dismissalDate: Int64?
        public var relevanceScore: Double?
        /// Channel jobs: only `liveactivity-update` subscriptions with this activityID receive it.
        public var activityID: String?

        var jsonValue: JSONValue {
            var fields: [String: JSONValue] = ["event": .string(event.rawValue), "contentState": contentState]
            fields["alert"] = alert
            fields["staleDate"] = staleDate.map { .number(Double($0)) }
            fields["dismissalDate"] = dismissalDate.map { .number(Double($0)) }
            fields["relevanceScore"] = relevanceScore.map { .number($0) }
            fields["activityID"] = activityID.map { .string($0) }
            return .object(fields)
        }

        public init(event: Event, contentState: JSONValue, alert: JSONValue? = nil, staleDate: Int64? = nil,
                    dismissalDate: Int64? = nil, relevanceScore: Double? = nil, activityID: String? = nil) {
            (self.event, self.contentState, self.alert) = (event, contentState, alert)
            (self.staleDate, self.dismissalDate, self.relevanceScore, self.activityID) =
                (staleDate, dismissalDate, relevanceScore, activityID)
        }
    }

    /// A push-to-start of a new Live Activity (iOS 17.2+).
    public struct Start: Sendable, Equatable {
        public var attributesType: String
        public var attributes: JSONValue
        public var contentState: JSONValue
        public var alert: JSONValue
        /// iOS 18: the broadcast channel id (`aps.input-push-channel`) the started activity joins.
        public var inputPushChannel: String?
        /// iOS 18: true asks the started activity for an update push token (`aps.input-push-token: 1`).
        public var inputPushToken: Bool?

        public init(attributesType: String, attributes: JSONValue, contentState: JSONValue, alert: JSONValue,
                    inputPushChannel: String? = nil, inputPushToken: Bool? = nil) {
            (self.attributesType, self.attributes, self.contentState, self.alert) =
                (attributesType, attributes, contentState, alert)
            (self.inputPushChannel, self.inputPushToken) = (inputPushChannel, inputPushToken)
        }
    }

    /// A post job that makes the post's iOS 18 broadcast channel in one environment (the dispatcher holds the APNs
    /// key; herald-ingest waits for the channel to be stored).
    public struct BroadcastChannel: Sendable, Equatable {
        public var environment: APNsEnvironment
        public var storagePolicy: APNsStoragePolicy

        public init(environment: APNsEnvironment, storagePolicy: APNsStoragePolicy) {
            (self.environment, self.storagePolicy) = (environment, storagePolicy)
        }
    }

    /// Set on jobs `heraldctl replay` re-publishes from the dead-letter topic.
    public struct ReplayOf: Sendable, Equatable {
        public var jobId: String
        public var dlqPartition: Int32
        public var dlqOffset: Int64
        /// The channel or post the push first went out for (a replayed job is a device job), so that
        /// `heraldctl dlq --channel/--post` still finds its dead letters when the replay fails again.
        public var channel: String?
        public var postIdHash: String?

        public init(jobId: String, dlqPartition: Int32, dlqOffset: Int64, channel: String? = nil,
                    postIdHash: String? = nil) {
            (self.jobId, self.dlqPartition, self.dlqOffset) = (jobId, dlqPartition, dlqOffset)
            (self.channel, self.postIdHash) = (channel, postIdHash)
        }
    }

    public var version: Int
    public var id: String
    public var appId: String
    /// RFC 3339 with milliseconds, UTC.
    public var createdAt: String
    public var target: Target
    /// Channel jobs: the complete APNs payload for `alert` subscribers.
    public var alert: JSONValue?
    public var liveActivity: LiveActivity?
    public var start: Start?
    /// Device jobs: the complete APNs payload.
    public var payload: JSONValue?
    /// Device jobs: `apns-push-type`; defaults from the token type.
    public var pushType: String?
    public var priority: Int?
    /// UNIX seconds; 0 means deliver once and don't store.
    public var expiration: Int64?
    public var collapseId: String?
    /// Post jobs: the last update; the post's registrations are removed once it is sent.
    public var final: Bool?
    /// Post jobs: make the post's broadcast channel instead of sending an update.
    public var broadcastChannel: BroadcastChannel?
    public var replayOf: ReplayOf?

    public init(id: String, appId: String, createdAt: Date = Date(), target: Target) {
        self.version = Self.currentVersion
        self.id = id
        self.appId = appId
        self.createdAt = Timestamp.rfc3339(createdAt)
        self.target = target
    }

    /// The `apns-id` of this job's push to `token`: the same for every attempt and every re-delivery of the job
    /// (after a crash or rebalance), so a duplicate is recognisable in APNs' answers, logs and dead letters. A
    /// UUID (version 8, RFC 9562) from the SHA-256 of app, job id and token.
    public func apnsID(token: String) -> UUID {
        // One buffer, no intermediate strings: this runs for every push of a fan-out. Tokens are hex, so lowering
        // ASCII letters is all `lowercased()` would do.
        var input = [UInt8]()
        input.reserveCapacity(appId.utf8.count + id.utf8.count + token.utf8.count + 2)
        input += appId.utf8
        input.append(UInt8(ascii: "\n"))
        input += id.utf8
        input.append(UInt8(ascii: "\n"))
        for c in token.utf8 { input.append(c >= UInt8(ascii: "A") && c <= UInt8(ascii: "Z") ? c | 0x20 : c) }
        var bytes = SHA256.hash(input)
        bytes[6] = bytes[6] & 0x0f | 0x80
        bytes[8] = bytes[8] & 0x3f | 0x80
        return UUID(bytes: bytes)
    }

    /// The Kafka record key: one target's jobs go to one partition, in order.
    public var recordKey: String {
        switch target {
        case .channel(let name): "\(appId)/\(name)"
        case .post(let hash): "\(appId)/post/\(hash)"
        case .device(let device): "\(appId)/device/\(DeviceToken.keyHash(device.token))"
        case .broadcast(let broadcast): "\(appId)/broadcast/\(broadcast.channelId)"
        }
    }

    /// True when this job ends its Live Activities (an `end` event or `final`).
    public var isFinal: Bool { final == true || liveActivity?.event == .end }

    /// The record value: compact JSON with sorted keys, absent fields left out.
    public func encoded() -> [UInt8] { jsonValue.encoded() }

    /// The job as a JSON value, field for field as schemas/push-job.schema.json names them (built by hand:
    /// `JSONEncoder` was the larger part of herald-ingest's CPU time per event).
    var jsonValue: JSONValue {
        var fields: [String: JSONValue] = [
            "version": .number(Double(version)), "id": .string(id), "appId": .string(appId),
            "createdAt": .string(createdAt), "target": target.jsonValue,
        ]
        fields["alert"] = alert
        fields["liveActivity"] = liveActivity?.jsonValue
        if let start {
            var content: [String: JSONValue] = ["attributesType": .string(start.attributesType), "attributes": start.attributes,
                                                "contentState": start.contentState, "alert": start.alert]
            content["inputPushChannel"] = start.inputPushChannel.map { .string($0) }
            content["inputPushToken"] = start.inputPushToken.map { .bool($0) }
            fields["start"] = .object(content)
        }
        fields["payload"] = payload
        fields["pushType"] = pushType.map { .string($0) }
        fields["priority"] = priority.map { .number(Double($0)) }
        fields["expiration"] = expiration.map { .number(Double($0)) }
        fields["collapseId"] = collapseId.map { .string($0) }
        fields["final"] = final.map { .bool($0) }
        if let broadcastChannel {
            fields["broadcastChannel"] = .object(["environment": .string(broadcastChannel.environment.rawValue),
                                                  "storagePolicy": .string(broadcastChannel.storagePolicy.name)])
        }
        if let replayOf {
            var origin: [String: JSONValue] = ["jobId": .string(replayOf.jobId),
                                               "dlqPartition": .number(Double(replayOf.dlqPartition)),
                                               "dlqOffset": .number(Double(replayOf.dlqOffset))]
            origin["channel"] = replayOf.channel.map { .string($0) }
            origin["postIdHash"] = replayOf.postIdHash.map { .string($0) }
            fields["replayOf"] = .object(origin)
        }
        return .object(fields)
    }
}
