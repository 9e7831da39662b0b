import Foundation
import HeraldAPNsCore
import HeraldRuntime

/// One record on `herald.dlq` (schemas/dead-letter.schema.json, version 1): one delivery that failed for good,
/// with everything needed to see why and to send it again (`heraldctl replay`). The dispatcher writes it and
/// heraldctl reads it, both through `encoded()` and `decode(_:)`.
///
/// Record key: `<appId>/device/<SHA-256 of the token>`, or `<appId>/job/<jobId>` for a job that was invalid as a whole.
public struct DeadLetter: Sendable, Equatable {
    public static let currentVersion = 1

    /// How a delivery ended.
    public enum Disposition: String, Sendable, CaseIterable {
        /// APNs answered with an error that retrying cannot fix, or the request was refused before sending.
        case rejected
        /// A retryable failure persisted through every attempt.
        case retriesExhausted = "retries_exhausted"
        /// The record is not a valid job, or names an unknown app.
        case invalidJob = "invalid_job"
        /// The record has no `herald-signature` header by the deployment's or its app's secret: nothing was sent.
        case invalidSignature = "invalid_signature"
        /// Redis answered the job's reads or writes with the same error on every try (a key of the wrong
        /// type, say): the whole job is kept, to be produced again once the data is fixed.
        case storeError = "store_error"
    }

    /// Where the failed job was read from.
    public struct Source: Sendable, Equatable {
        public var topic: String
        public var partition: Int32
        public var offset: Int64

        public init(topic: String, partition: Int32, offset: Int64) {
            (self.topic, self.partition, self.offset) = (topic, partition, offset)
        }
    }

    public var version: Int = Self.currentVersion
    public var appId: String
    /// The job, when it decoded; `rawJob` holds the record's text when it did not (`invalid_job`): its first
    /// `rawJobLimit` bytes, with the whole record's size and SHA-256 beside them.
    public var job: PushJob?
    public var rawJob: String?
    public var rawJobBytes: Int?
    public var rawJobSha256: String?
    public var jobId: String?
    /// The device the push was for (absent for an invalid job).
    public var deviceToken: String?
    public var tokenType: TokenType?
    public var environment: APNsEnvironment?
    /// The request exactly as sent to APNs.
    public var topic: String?
    public var pushType: String?
    public var payload: JSONValue?
    public var priority: Int?
    public var expiration: Int64?
    public var collapseId: String?
    /// The push's `apns-id` (`PushJob.apnsID(token:)`): every attempt and re-delivery of it carried this one.
    public var apnsId: String?
    /// The last answer's `apns-unique-id` (Apple's development environment only): where to find the push in the
    /// Push Notifications Console's delivery log.
    public var apnsUniqueId: String?
    /// A failed broadcast's channel (such a letter names no device) and its storage policy.
    public var channelId: String?
    public var storagePolicy: APNsStoragePolicy?
    /// APNs' HTTP status; absent when APNs never answered (timeouts, connection failures).
    public var status: Int?
    /// APNs' reason (`BadTopic`, `ServiceUnavailable`…), Herald's error kind when APNs never answered
    /// (`timeout`, `connection_failed`, `invalid_request`…), or `invalid_job`.
    public var reason: String
    public var disposition: Disposition?
    /// What went wrong, for people.
    public var message: String?
    public var attempts: Int
    public var firstAttemptAt: String?
    public var lastAttemptAt: String?
    public var deadLetteredAt: String
    public var source: Source?

    public init(appId: String, job: PushJob?, reason: String, attempts: Int, deadLetteredAt: Date = Date()) {
        self.appId = appId
        self.job = job
        self.jobId = job?.id
        self.reason = reason
        self.attempts = attempts
        self.deadLetteredAt = Timestamp.rfc3339(deadLetteredAt)
    }

    /// The Kafka record key.
    public var recordKey: String {
        if let deviceToken { return "\(appId)/device/\(DeviceToken.keyHash(deviceToken))" }
        return "\(appId)/job/\(jobId ?? "unknown")"
    }

    /// Compact JSON with sorted keys, absent fields left out.
    public func encoded() -> [UInt8] { jsonValue.encoded() }

    var jsonValue: JSONValue {
        var fields: [String: JSONValue] = [
            "version": .number(Double(version)), "appId": .string(appId), "reason": .string(reason),
            "attempts": .number(Double(attempts)), "deadLetteredAt": .string(deadLetteredAt),
        ]
        fields["job"] = job?.jsonValue
        fields["rawJob"] = rawJob.map { .string($0) }
        fields["rawJobBytes"] = rawJobBytes.map { .number(Double($0)) }
        fields["rawJobSha256"] = rawJobSha256.map { .string($0) }
        fields["jobId"] = jobId.map { .string($0) }
        fields["deviceToken"] = deviceToken.map { .string($0) }
        fields["tokenType"] = tokenType.map { .string($0.rawValue) }
        fields["environment"] = environment.map { .string($0.rawValue) }
        fields["topic"] = topic.map { .string($0) }
        fields["pushType"] = pushType.map { .string($0) }
        fields["payload"] = payload
        fields["priority"] = priority.map { .number(Double($0)) }
        fields["expiration"] = expiration.map { .number(Double($0)) }
        fields["collapseId"] = collapseId.map { .string($0) }
        fields["apnsId"] = apnsId.map { .string($0) }
        fields["apnsUniqueId"] = apnsUniqueId.map { .string($0) }
        fields["channelId"] = channelId.map { .string($0) }
        fields["storagePolicy"] = storagePolicy.map { .string($0.name) }
        fields["status"] = status.map { .number(Double($0)) }
        fields["disposition"] = disposition.map { .string($0.rawValue) }
        fields["message"] = message.map { .string($0) }
        fields["firstAttemptAt"] = firstAttemptAt.map { .string($0) }
        fields["lastAttemptAt"] = lastAttemptAt.map { .string($0) }
        if let source {
            fields["source"] = .object(["topic": .string(source.topic), "partition": .number(Double(source.partition)),
                                        "offset": .number(Double(source.offset))])
        }
        return .object(fields)
    }

    /// Reads a record of `herald.dlq`: required members present with the right type, an absent or null optional
    /// one nil, members a later version may add ignored. Throws for anything else, and for another version.
    public static func decode(_ bytes: [UInt8]) throws(ValidationError) -> DeadLetter {
        guard let root = JSONValue(parsing: bytes) else { throw ValidationError(code: "invalid_dead_letter", message: "not JSON") }
        let fields = try FieldReader(root)
        let version = try fields.integer("version", in: int32).map { Int($0) } ?? currentVersion
        guard version == currentVersion else {
            throw .invalid("version", "dead letter version \(version) is not \(currentVersion)")
        }
        // Required but possibly empty: a record that is not a job at all names no app.
        var letter = DeadLetter(appId: try required(fields.string("appId"), "appId"), job: nil,
                                reason: try required(fields.string("reason"), "reason"),
                                attempts: Int(try required(fields.integer("attempts", in: int32), "attempts")))
        letter.deadLetteredAt = try required(fields.string("deadLetteredAt"), "deadLetteredAt")
        if let job = fields.value("job") { letter.job = try PushJob.decode(job) }
        letter.rawJob = try fields.string("rawJob")
        letter.rawJobBytes = try fields.integer("rawJobBytes", in: 0...Int64(Int32.max)).map { Int($0) }
        letter.rawJobSha256 = try fields.string("rawJobSha256")
        letter.jobId = try fields.string("jobId")
        letter.deviceToken = try fields.string("deviceToken")
        letter.tokenType = try fields.enumeration("tokenType", TokenType.self)
        letter.environment = try fields.enumeration("environment", APNsEnvironment.self)
        letter.topic = try fields.string("topic")
        letter.pushType = try fields.string("pushType")
        letter.payload = try fields.object("payload")
        letter.priority = try fields.integer("priority", in: int32).map { Int($0) }
        letter.expiration = try fields.integer("expiration", in: exact)
        letter.collapseId = try fields.string("collapseId")
        letter.apnsId = try fields.string("apnsId")
        letter.apnsUniqueId = try fields.string("apnsUniqueId")
        letter.channelId = try fields.string("channelId")
        letter.storagePolicy = try fields.storagePolicy("storagePolicy")
        letter.status = try fields.integer("status", in: int32).map { Int($0) }
        letter.disposition = try fields.enumeration("disposition", Disposition.self)
        letter.message = try fields.string("message")
        letter.firstAttemptAt = try fields.string("firstAttemptAt")
        letter.lastAttemptAt = try fields.string("lastAttemptAt")
        if let value = fields.value("source") {
            let source = try FieldReader(value, prefix: "source.")
            letter.source = Source(topic: try required(source.string("topic"), "source.topic"),
                                   partition: Int32(try required(source.integer("partition", in: int32), "source.partition")),
                                   offset: try required(source.integer("offset", in: exact), "source.offset"))
        }
        return letter
    }

    private static let int32: ClosedRange<Int64> = Int64(Int32.min)...Int64(Int32.max)
    /// Integers a JSON number (a `Double`) holds exactly.
    private static let exact: ClosedRange<Int64> = -(1 << 53) + 1...(1 << 53) - 1

    private static func required<T>(_ value: T?, _ field: String) throws(ValidationError) -> T {
        guard let value else { throw .missing(field) }
        return value
    }

    /// The channel the failed push first went out for: its job's, or, for a replayed job, the one it carried.
    public var originalChannel: String? { job?.target.channel ?? job?.replayOf?.channel }
    /// The post the failed push first went out for, likewise.
    public var originalPost: String? { job?.target.postIdHash ?? job?.replayOf?.postIdHash }

    /// A job that sends this push again, marked `replayOf`: a device job, or a broadcast job for a failed
    /// broadcast; nil when the dead letter names neither (an invalid job) or carries no payload.
    public func replayJob(partition: Int32, offset: Int64, id: String, now: Date = Date()) -> PushJob? {
        guard let payload else { return nil }
        var job: PushJob
        if let deviceToken {
            job = PushJob(id: id, appId: appId, createdAt: now,
                          target: .device(deviceToken, tokenType: tokenType ?? .alert,
                                          environment: environment ?? .production, topic: topic))
            job.pushType = pushType
        } else if let channelId, let environment, let storagePolicy {
            job = PushJob(id: id, appId: appId, createdAt: now,
                          target: .broadcast(.init(channelId: channelId, environment: environment, storagePolicy: storagePolicy)))
        } else {
            return nil
        }
        job.payload = payload
        job.priority = priority
        job.expiration = expiration
        job.collapseId = collapseId
        job.replayOf = PushJob.ReplayOf(jobId: jobId ?? "unknown", dlqPartition: partition, dlqOffset: offset,
                                        channel: originalChannel, postIdHash: originalPost)
        return job
    }
}
