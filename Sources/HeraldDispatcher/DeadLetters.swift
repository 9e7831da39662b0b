import Foundation
import HeraldCore
import HeraldCrypto
import HeraldKafka
import HeraldRuntime

/// One record on the dead-letter topic (schemas/dead-letter.schema.json, version 1): a push that failed for
/// good, or a job that could not be used, with every fact a replay needs.
struct DeadLetterEntry: Sendable {
    enum Reason: String, Sendable {
        /// The record is not a valid job, or names an unknown app.
        case invalidJob = "invalid_job"
        /// APNs answered with an error that retrying cannot fix, or the request was refused before sending.
        case rejected
        /// A retryable failure persisted through every attempt.
        case retriesExhausted = "retries_exhausted"
    }

    /// Where the job was read from.
    struct Source: Sendable {
        var topic: String
        var partition: Int32
        var offset: Int64
        var key: [UInt8]?
    }

    /// A failed delivery attempt sequence.
    struct Failure: Sendable {
        var status: Int?
        var apnsReason: String?
        /// A local error's kind (`timeout`, `connection_failed`, `invalid_request`, …) when APNs did not answer.
        var error: String?
        var attempts: Int
        var firstAttemptAt: Date
        var lastAttemptAt: Date
    }

    var reason: Reason
    var message: String
    var source: Source
    /// The job, when it was valid; an invalid job's record is kept as `rawJob` only.
    var job: PushJob?
    var rawJob: [UInt8]
    var jobId: String?
    var appId: String?
    var push: Push?
    var priority: Int?
    var expiration: Int64?
    var collapseId: String?
    var failure: Failure?
    var failedAt = Date()

    /// `<appId>/device/<token>` for a failed push, so the topic is partitioned like device jobs; the job's own
    /// key for an invalid job.
    var recordKey: [UInt8] {
        if let push, let appId { return Array("\(appId)/device/\(push.token)".utf8) }
        return source.key ?? Array("invalid/\(jobId ?? "-")".utf8)
    }

    /// The record written to the dead-letter topic, in the shared format heraldctl reads.
    var record: HeraldCore.DeadLetter {
        var letter = HeraldCore.DeadLetter(appId: appId ?? "", job: job,
                                           reason: failure?.apnsReason ?? failure?.error ?? reason.rawValue,
                                           attempts: failure?.attempts ?? 0, deadLetteredAt: failedAt)
        letter.jobId = jobId
        letter.disposition = reason.rawValue
        letter.message = message
        if letter.job == nil { letter.rawJob = String(decoding: rawJob, as: UTF8.self) }
        letter.deviceToken = push?.token
        letter.tokenType = push?.tokenType
        letter.environment = push?.environment
        letter.topic = push?.topic
        letter.pushType = push?.pushType.rawValue
        letter.payload = push.flatMap { try? JSONDecoder().decode(JSONValue.self, from: Data($0.payload)) }
        letter.priority = priority
        letter.expiration = expiration
        letter.collapseId = collapseId
        letter.status = failure?.status
        letter.firstAttemptAt = failure.map { Timestamp.rfc3339($0.firstAttemptAt) }
        letter.lastAttemptAt = failure.map { Timestamp.rfc3339($0.lastAttemptAt) }
        letter.source = .init(topic: source.topic, partition: source.partition, offset: source.offset)
        return letter
    }
}

/// Writes dead letters and waits for the broker's acknowledgement, trying again until it comes: a push is only
/// settled (and its job's offset committable) once its dead letter is stored.
struct DeadLetterWriter: Sendable {
    let producer: KafkaProducer
    let topic: String
    let retryDelay: Duration
    let metrics: DispatcherMetrics
    let logger: Logger

    /// True once stored; false only when the task was cancelled first.
    func write(_ letter: DeadLetterEntry) async -> Bool {
        let value = letter.record.encoded()
        let key = letter.recordKey
        while !Task.isCancelled {
            do {
                _ = try await producer.send(topic: topic, key: key, value: value)
                metrics.deadLetters.labels(letter.reason.rawValue).increment()
                logger.warning("dead-lettered", [
                    "dlq.reason": letter.reason.rawValue, "job.id": letter.jobId ?? "", "app": letter.appId ?? "",
                    "apns.status": letter.failure?.status.map(String.init) ?? "",
                    "apns.reason": letter.failure?.apnsReason ?? letter.failure?.error ?? "",
                    "token": letter.push.map { Redaction.tag($0.token) } ?? "",
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
