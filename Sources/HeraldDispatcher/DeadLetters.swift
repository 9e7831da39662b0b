import Foundation
import HeraldAPNs
import HeraldCore
import HeraldCrypto
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldStore

extension DeadLetter {
    /// How much of an unusable record a dead letter keeps: enough to see what it was, small enough that the
    /// dead letter always fits the broker's limit, whatever the record.
    static let rawJobLimit = 16 * 1024

    /// A job record that could not be used: its first `rawJobLimit` bytes as text, its size and SHA-256, and
    /// what could be read of it.
    init(invalidJob record: [UInt8], source: Source, job: PushJob?, error: ValidationError, at time: Date = Date()) {
        self.init(appId: job?.appId ?? "", job: nil, reason: Disposition.invalidJob.rawValue, attempts: 0, deadLetteredAt: time)
        jobId = job?.id
        disposition = .invalidJob
        message = error.description
        rawJob = String(decoding: record.prefix(Self.rawJobLimit), as: UTF8.self)
        rawJobBytes = record.count
        rawJobSha256 = Hex.encode(SHA256.hash(record))
        self.source = source
    }

    /// A job record whose signature is missing or wrong: kept as an unusable record, never decoded or replayed.
    init(unsignedJob record: [UInt8], keyApp: String, source: Source, at time: Date = Date()) {
        self.init(invalidJob: record, source: source, job: nil,
                  error: ValidationError(code: "invalid_signature",
                                         message: "the record has no valid \(JobSignature.header) header"), at: time)
        appId = keyApp
        reason = Disposition.invalidSignature.rawValue
        disposition = .invalidSignature
    }

    /// A whole job Redis kept refusing (`StoreRefusal`): the job as read, to be produced again once fixed.
    init(storeRefused job: PushJob, source: Source, refusal: StoreRefusal, at time: Date = Date()) {
        self.init(appId: job.appId, job: job, reason: Disposition.storeError.rawValue, attempts: refusal.tries,
                  deadLetteredAt: time)
        jobId = job.id
        disposition = .storeError
        message = refusal.description
        self.source = source
    }

    /// One push that failed for good: the request exactly as sent, and how its attempts went.
    init(push: Push, of job: PushJob, source: Source, failure: DeliveryFailure, disposition: Disposition,
         at time: Date = Date()) {
        self.init(appId: job.appId, job: job, reason: failure.apnsReason ?? failure.error ?? disposition.rawValue,
                  attempts: failure.attempts, deadLetteredAt: time)
        self.disposition = disposition
        let what = failure.apnsReason.map { "APNs answered \(failure.status ?? 0) \($0)" }
            ?? failure.status.map { "APNs answered \($0)" } ?? "no answer from APNs (\(failure.error ?? "unknown"))"
        message = disposition == .retriesExhausted ? "\(what) on all \(failure.attempts) attempts" : what
        (deviceToken, tokenType, environment, topic) = (push.token, push.tokenType, push.environment, push.topic)
        pushType = push.pushType.rawValue
        payload = JSONValue(parsing: push.payload)
        (priority, expiration, collapseId) = (job.priority, job.expiration, job.collapseId)
        apnsId = UUIDText.string(job.apnsID(token: push.token))
        status = failure.status
        apnsUniqueId = failure.apnsUniqueID
        firstAttemptAt = Timestamp.rfc3339(failure.firstAttemptAt)
        lastAttemptAt = Timestamp.rfc3339(failure.lastAttemptAt)
        self.source = source
    }

    /// A broadcast APNs refused, or that had no answer on every attempt.
    init(broadcast channel: BroadcastChannel, payload: [UInt8], of job: PushJob, source: Source,
         failure: DeliveryFailure, disposition: Disposition, at time: Date = Date()) {
        self.init(appId: job.appId, job: job, reason: failure.apnsReason ?? failure.error ?? disposition.rawValue,
                  attempts: failure.attempts, deadLetteredAt: time)
        self.disposition = disposition
        let what = failure.apnsReason.map { "APNs answered \(failure.status ?? 0) \($0) to the broadcast" }
            ?? "no answer from APNs to the broadcast (\(failure.error ?? "unknown"))"
        message = disposition == .retriesExhausted ? "\(what) on all \(failure.attempts) attempts" : what
        channelId = channel.channelID
        storagePolicy = channel.storagePolicy
        environment = channel.environment
        pushType = APNsPushType.liveactivity.rawValue
        self.payload = JSONValue(parsing: payload)
        (priority, expiration) = (job.priority, job.expiration)
        status = failure.status
        apnsUniqueId = failure.apnsUniqueID
        firstAttemptAt = Timestamp.rfc3339(failure.firstAttemptAt)
        lastAttemptAt = Timestamp.rfc3339(failure.lastAttemptAt)
        self.source = source
    }
}

extension DeadLetter {
    /// The `reason` label of the dead-letter metrics: Apple's reason for an APNs answer (`other` for one Apple does
    /// not document, so a server cannot grow the metric without bound), the local error's kind when APNs did not
    /// answer, or the disposition of a letter for a whole job.
    var metricReason: String {
        guard disposition == .rejected || disposition == .retriesExhausted else { return reason }
        return status == nil ? reason : APNsReason(reason).metricLabel
    }
}

/// Redis answered the same step of a job with an error about the data itself on every try (WRONGTYPE: a key of
/// another type where Herald's belongs): retrying will not help until someone fixes the key, so the job is
/// dead-lettered instead of holding its partition. Every other failure (an outage, LOADING, OOM, READONLY during
/// a failover) is retried for as long as it lasts.
struct StoreRefusal: Error, CustomStringConvertible {
    /// How many such answers in a row make a refusal.
    static let tries = 5

    /// `error` when it is an answer about the data (`RedisError.isAboutTheData`), which counts towards a refusal.
    static func dataError(_ error: any Error) -> RedisError? {
        guard let redis = error as? RedisError, redis.isAboutTheData else { return nil }
        return redis
    }

    var what: String
    var tries: Int
    var error: RedisError
    var description: String { "Redis refused to \(what) on all \(tries) tries: \(error.message)" }
}

/// How a push's attempts went, for its dead letter.
struct DeliveryFailure: Sendable {
    var status: Int?
    var apnsReason: String?
    /// A local error's kind (`timeout`, `connection_failed`, `invalid_request`, …) when APNs did not answer.
    var error: String?
    /// The last answer's `apns-unique-id`, when APNs sent one.
    var apnsUniqueID: String? = nil
    var attempts: Int
    var firstAttemptAt: Date
    var lastAttemptAt: Date
}

/// Writes dead letters and waits for the broker's acknowledgement, trying again until it comes: a push is only
/// settled (and its job's offset committable) once its dead letter is stored. Letters are signed as jobs are
/// (`herald-signature`), so a replay can tell them from records others wrote to the topic.
struct DeadLetterWriter: Sendable {
    let producer: KafkaProducer
    let topic: String
    let signing: JobSigning
    let retryDelay: Duration
    let metrics: DispatcherMetrics
    let logger: Logger

    /// True once stored; false only when the task was cancelled first.
    func write(_ letter: DeadLetter) async -> Bool {
        let value = letter.encoded()
        let key = Array(letter.recordKey.utf8)
        let disposition = (letter.disposition ?? .rejected).rawValue
        while !Task.isCancelled {
            do {
                _ = try await producer.send(topic: topic, key: key, value: value, headers: signing.headers(for: value))
                metrics.deadLetters.labels(letter.metricReason, disposition).increment()
                logger.warning("dead-lettered", [
                    "dlq.reason": disposition, "job.id": letter.jobId ?? "", "app": letter.appId,
                    "apns.status": letter.status.map(String.init) ?? "",
                    "apns.reason": [.invalidJob, .invalidSignature].contains(letter.disposition) ? "" : letter.reason,
                    "token": letter.deviceToken.map { Redaction.tag($0) } ?? "",
                    "apns.unique_id": letter.apnsUniqueId ?? "",
                ])
                return true
            } catch where error.code.refusesTheRecordForGood {
                // Retrying would wedge the partition behind this record for good: settle without the letter.
                metrics.deadLettersRefused.labels(letter.metricReason, disposition).increment()
                logger.error("the broker refuses this dead letter for good; the push is settled without it", [
                    "error": "\(error)", "dlq.topic": topic, "dlq.reason": disposition, "job.id": letter.jobId ?? "",
                    "app": letter.appId, "dlq.bytes": String(value.count),
                ])
                return true
            } catch {
                logger.error("cannot write a dead letter; retrying", ["error": "\(error)", "dlq.topic": topic])
                do { try await Task.sleep(for: retryDelay) } catch { return false }
            }
        }
        return false
    }
}
