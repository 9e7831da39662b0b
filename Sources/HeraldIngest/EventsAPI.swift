import HeraldCore
import HeraldHTTP
import HeraldKafka
import HeraldRuntime
import HeraldStore

/// Producer endpoints (secret keys): events become push jobs on `herald.jobs`, answered 202 only once the
/// broker has acknowledged the record.
struct EventsAPI: Sendable {
    let producer: KafkaProducer
    let idempotency: IdempotencyStore
    let topic: String
    /// How long a request waits for the broker's acknowledgement before answering 503.
    let publishTimeout: Duration
    /// Answers the requests still waiting at `publishTimeout`.
    let deadlines: PublishDeadlines
    let gate: Gatekeeper
    let logger: Logger
    let published = MetricsRegistry.shared.counter("herald_ingest_jobs_published_total",
                                                   help: "Push jobs acknowledged by the broker, by target.",
                                                   labels: ["target"])
    let publishLatency = MetricsRegistry.shared.histogram("herald_ingest_publish_seconds",
                                                          help: "Time from publishing a job to the broker's ack.")
    let publishFailures = MetricsRegistry.shared.counter("herald_ingest_publish_failures_total",
                                                         help: "Jobs the broker did not acknowledge in time.")

    func register(on router: inout Router) {
        router.post("/v1/apps/{appID}/events", gate.endpoint(.producer) { request, admission in
            let body = try request.jsonBody()
            let job = try EventIntake.channelEvent(body, appID: admission.app.id, jobID: Self.idempotencyKey(request))
            return try await publish(job, clientChoseID: Self.clientChoseID(request, body))
        })
        router.post("/v1/apps/{appID}/activities/{postIdHash}/events", gate.endpoint(.producer) { request, admission in
            let body = try request.jsonBody()
            let job = try EventIntake.activityEvent(body, appID: admission.app.id,
                                                    postIDHash: try request.pathParameter("postIdHash"),
                                                    jobID: Self.idempotencyKey(request))
            return try await publish(job, clientChoseID: Self.clientChoseID(request, body))
        })
        router.post("/v1/apps/{appID}/devices/{deviceToken}/push", gate.endpoint(.producer) { request, admission in
            let body = try request.jsonBody()
            let job = try EventIntake.devicePush(body, appID: admission.app.id,
                                                 deviceToken: try request.pathParameter("deviceToken"),
                                                 jobID: Self.idempotencyKey(request))
            return try await publish(job, clientChoseID: Self.clientChoseID(request, body))
        })
    }

    /// Publishes once per client-chosen id (24 h window) and answers 202 with the job id after the ack.
    ///
    /// The answer comes within `publishTimeout` whatever the broker does: 503 when the broker has not
    /// acknowledged by then. A record that is acknowledged after its 503 was sent is published all the same
    /// (at least once); its id's claim is then settled by the late report, so a retry with the same id answers
    /// 409 meanwhile and the first job's id afterwards, and never publishes twice.
    private func publish(_ job: PushJob, clientChoseID: Bool) async throws -> HTTPResponse {
        if clientChoseID {
            switch try await idempotency.claim(app: job.appId, id: job.id) {
            case .claimed: break
            case .alreadyPublished: return Self.accepted(job)
            case .inProgress:
                throw HTTPError(status: 409, code: "in_progress", message: "a request with this id is being published",
                                field: "id")
            }
        }
        let start = ContinuousClock.now
        switch await awaitAck(job, settlesClaim: clientChoseID) {
        case .acknowledged:
            publishLatency.observe(since: start)
            published.labels(job.target.kind.rawValue).increment()
            if clientChoseID { await markPublished(job) }
            return Self.accepted(job)
        case .failed(let error):
            publishFailures.increment()
            if clientChoseID { try? await idempotency.release(app: job.appId, id: job.id) }
            throw error
        case .timedOut:
            publishFailures.increment()
            logger.warning("kafka did not acknowledge in time", ["job.id": job.id, "timeout": "\(publishTimeout)"])
            throw HTTPError.unavailable("the job queue did not acknowledge the event within \(publishTimeout); retry later"
                                        + (clientChoseID ? " with the same id" : ""))
        }
    }

    /// Queues the job and waits for the broker's answer, at most `publishTimeout`.
    private func awaitAck(_ job: PushJob, settlesClaim: Bool) async -> PublishOutcome {
        await withCheckedContinuation { continuation in
            let waiter = PublishWaiter(continuation)
            do throws(KafkaError) {
                try producer.send(topic: topic, key: Array(job.recordKey.utf8), value: job.encoded()) { result in
                    // Runs on the producer's thread: anything slow goes to a task.
                    let outcome: PublishOutcome = switch result {
                    case .success: .acknowledged
                    case .failure(let error): .failed(error)
                    }
                    if !waiter.resolve(outcome), settlesClaim { Task { await settleLate(job, outcome) } }
                }
            } catch {
                waiter.resolve(.failed(error))
                return
            }
            deadlines.add(waiter, at: .now + publishTimeout)
        }
    }

    /// The broker answered after the request got its 503: settle the id's claim the way the answer says.
    private func settleLate(_ job: PushJob, _ outcome: PublishOutcome) async {
        if case .acknowledged = outcome {
            published.labels(job.target.kind.rawValue).increment()
            await markPublished(job)
        } else {
            try? await idempotency.release(app: job.appId, id: job.id)
        }
    }

    private func markPublished(_ job: PushJob) async {
        // Published already: if Redis fails here the claim expires and a retry may publish again (at least once).
        do { try await idempotency.complete(app: job.appId, id: job.id) } catch {
            logger.warning("idempotency marker not saved", ["job.id": job.id, "error": "\(error)"])
        }
    }

    private static func idempotencyKey(_ request: HTTPRequest) -> String? { request.headers["Idempotency-Key"] }

    private static func clientChoseID(_ request: HTTPRequest, _ body: JSONValue) -> Bool {
        idempotencyKey(request) != nil || body["id"] != nil
    }

    private static func accepted(_ job: PushJob) -> HTTPResponse {
        .json(bytes: JSONValue.object(["jobId": .string(job.id)]).encoded(), status: 202)
    }
}

/// How a publish ended for the request waiting on it.
enum PublishOutcome: Sendable {
    case acknowledged
    case failed(KafkaError)
    case timedOut
}

/// Resumes a publishing request exactly once: with the broker's answer or the deadline's, whichever comes first.
final class PublishWaiter: Sendable {
    private let continuation: Lock<CheckedContinuation<PublishOutcome, Never>?>

    init(_ continuation: CheckedContinuation<PublishOutcome, Never>) {
        self.continuation = Lock(continuation)
    }

    /// Resumes the request unless something else already did; true when this call resumed it.
    @discardableResult
    func resolve(_ outcome: PublishOutcome) -> Bool {
        guard let continuation = continuation.withLock({ $0.take() }) else { return false }
        continuation.resume(returning: outcome)
        return true
    }
}

/// The publish deadlines of every waiting request, answered `.timedOut` by one sweep every few milliseconds.
///
/// Why not a timer task per request: creating, sleeping and cancelling one woke Swift's global pool twice per
/// event. Every request waits the same `publishTimeout`, so adding in arrival order keeps the queue sorted by
/// deadline and a sweep only looks at its front. Answered requests stay queued (a few words each) until their
/// deadline passes: at most the publish rate times the timeout.
final class PublishDeadlines: Sendable {
    /// How late a timed-out request may be answered past its deadline.
    static let sweepInterval: Duration = .milliseconds(20)

    private struct Queue {
        var entries: [(deadline: ContinuousClock.Instant, waiter: PublishWaiter)] = []
        /// Entries before `head` are swept; compacted once they are the larger part.
        var head = 0
    }

    private let queue = Lock(Queue())

    init() {}

    /// Answers `waiter` with `.timedOut` at `deadline` if nothing answered it before. Deadlines must not decrease
    /// from one call to the next (one timeout for every request); one that does is answered at most a sweep late.
    func add(_ waiter: PublishWaiter, at deadline: ContinuousClock.Instant) {
        queue.withLock { $0.entries.append((deadline, waiter)) }
    }

    /// Answers every request past its deadline.
    func expire(now: ContinuousClock.Instant = .now) {
        let due = queue.withLock { queue in
            let start = queue.head
            while queue.head < queue.entries.count, queue.entries[queue.head].deadline <= now { queue.head += 1 }
            let due = Array(queue.entries[start..<queue.head])
            if queue.head > 1024, queue.head * 2 > queue.entries.count {
                queue.entries.removeFirst(queue.head)
                queue.head = 0
            }
            return due
        }
        for entry in due { entry.waiter.resolve(.timedOut) }
    }

    /// Sweeps until the calling task is cancelled.
    func run() async {
        while !Task.isCancelled {
            try? await Task.sleep(for: Self.sweepInterval)
            expire()
        }
    }
}
