import Foundation
import HeraldAPNsCore
import HeraldRuntime

/// One record on `herald.dlq` (schemas/dead-letter.schema.json, version 1): one delivery that failed for good,
/// with everything needed to see why and to send it again (`heraldctl replay`).
///
/// Record key: `<appId>/device/<deviceToken>`, or `<appId>/job/<jobId>` for a job that was invalid as a whole.
public struct DeadLetter: Sendable, Codable, Equatable {
    public static let currentVersion = 1

    /// Where the failed job was read from.
    public struct Source: Sendable, Codable, Equatable {
        public var topic: String
        public var partition: Int32
        public var offset: Int64

        public init(topic: String, partition: Int32, offset: Int64) {
            (self.topic, self.partition, self.offset) = (topic, partition, offset)
        }
    }

    public var version: Int = Self.currentVersion
    public var appId: String
    /// The job, when it decoded; `rawJob` holds the record's text when it did not (`invalid_job`).
    public var job: PushJob?
    public var rawJob: String?
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
    /// APNs' HTTP status; absent when APNs never answered (timeouts, connection failures).
    public var status: Int?
    /// APNs' reason (`BadTopic`, `ServiceUnavailable`…), Herald's error kind when APNs never answered
    /// (`timeout`, `connection_failed`, `invalid_request`…), or `invalid_job`.
    public var reason: String
    /// How it ended: `rejected` (an error retrying cannot fix), `retries_exhausted`, or `invalid_job`.
    public var disposition: String?
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
        if let deviceToken { return "\(appId)/device/\(deviceToken)" }
        return "\(appId)/job/\(jobId ?? "unknown")"
    }

    public func encoded() -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return Array(try! encoder.encode(self))
    }

    public static func decode(_ bytes: [UInt8]) throws -> DeadLetter {
        try JSONDecoder().decode(DeadLetter.self, from: Data(bytes))
    }

    /// A device job that sends this push again, marked `replayOf`; nil when the dead letter names no device
    /// (an invalid job) or carries no payload.
    public func replayJob(partition: Int32, offset: Int64, id: String, now: Date = Date()) -> PushJob? {
        guard let deviceToken, let payload else { return nil }
        var job = PushJob(id: id, appId: appId, createdAt: now,
                          target: .device(deviceToken, tokenType: tokenType ?? .alert,
                                          environment: environment ?? .production, topic: topic))
        job.payload = payload
        job.pushType = pushType
        job.priority = priority
        job.expiration = expiration
        job.collapseId = collapseId
        job.replayOf = PushJob.ReplayOf(jobId: jobId ?? "unknown", dlqPartition: partition, dlqOffset: offset)
        return job
    }
}
