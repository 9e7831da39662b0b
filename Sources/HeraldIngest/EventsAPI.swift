import HeraldCore
import HeraldCrypto
import HeraldHTTP
import HeraldKafka
import HeraldRuntime
import HeraldStore

/// Producer endpoints (secret keys): events become push jobs on `herald.jobs`, answered 202 only once the
/// broker has acknowledged the record.
struct EventsAPI: Sendable {
    let producer: KafkaProducer
    let idempotency: IdempotencyStore
    let statuses: JobStatusStore
    let topic: String
    /// Signs every job record (the dispatcher refuses unsigned ones).
    let signing: JobSigning
    /// How long a request waits for the broker's acknowledgement before answering 503 (`producer`'s
    /// `message.timeout.ms`).
    let publishTimeout: Duration
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
        router.get("/v1/apps/{appID}/jobs/{jobId}", gate.endpoint(.producer) { request, admission in
            let id = try request.pathParameter("jobId")
            guard let status = try await statuses.read(app: admission.app.id, jobID: id) else {
                throw HTTPError(status: 404, code: "not_found",
                                message: "no job \(id) of this app within the last \(statuses.ttl.secondsText)")
            }
            return .json(bytes: status.jsonValue.encoded())
        })
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
    /// The answer comes soon after `publishTimeout` whatever the broker does (librdkafka reports a record it
    /// could not deliver within `message.timeout.ms`, checking about once a second): 503 when the broker has not
    /// acknowledged by then. A 503 releases a client-chosen id, so a retry with the same id publishes again.
    func publish(_ job: PushJob, clientChoseID: Bool) async throws -> HTTPResponse {
        // Names this request's claim on a client-chosen id, so only this request can release it.
        let claimer = clientChoseID ? SecureRandom.hex(8) : ""
        if clientChoseID {
            let claim: IdempotencyStore.Claim
            do { claim = try await idempotency.claim(app: job.appId, id: job.id, by: claimer) } catch {
                // Redis may have made the claim and lost its answer: freed, or the retry would get 409 for a while.
                await release(job, by: claimer)
                throw error
            }
            switch claim {
            case .claimed: break
            case .alreadyPublished: return Self.accepted(job)
            case .inProgress:
                throw HTTPError(status: 409, code: "in_progress", message: "a request with this id is being published",
                                field: "id")
            }
        }
        let start = ContinuousClock.now
        let outcome = await awaitAck(job)
        guard case .acknowledged = outcome else {
            publishFailures.increment()
            if clientChoseID { await release(job, by: claimer) }
            if case .failed(let error) = outcome { throw error }
            logger.warning("kafka did not acknowledge in time", ["job.id": job.id, "timeout": "\(publishTimeout)"])
            throw HTTPError.unavailable("the job queue did not acknowledge the event within \(publishTimeout); retry later"
                                        + (clientChoseID ? " with the same id" : ""))
        }
        publishLatency.observe(since: start)
        published.labels(job.target.kind.rawValue).increment()
        do { try await statuses.accepted(job) } catch {
            // The push goes out all the same; its status appears when the dispatcher starts it.
            logger.warning("job status not saved", ["job.id": job.id, "error": "\(error)"])
        }
        if clientChoseID { await markPublished(job) }
        return Self.accepted(job)
    }

    /// Frees the job's id for the client's retry before the 503 answers it, or in the background when Redis fails
    /// that first try.
    private func release(_ job: PushJob, by claimer: String) async {
        do { try await idempotency.release(app: job.appId, id: job.id, by: claimer) } catch { retryRelease(job, by: claimer) }
    }

    /// Frees the job's id in the background: a few tries, a second apart, as Redis may be failing too; the claim
    /// expires by itself otherwise.
    private func retryRelease(_ job: PushJob, by claimer: String) {
        Task { [idempotency, logger] in
            for attempt in 1...3 {
                do { return try await idempotency.release(app: job.appId, id: job.id, by: claimer) } catch {
                    if attempt == 3 {
                        logger.warning("cannot free the event's id; its retries get 409 until the claim expires",
                                       ["job.id": job.id, "error": "\(error)"])
                        return
                    }
                    try? await Task.sleep(for: .seconds(1))
                }
            }
        }
    }

    /// Queues the job and waits for the broker's answer.
    private func awaitAck(_ job: PushJob) async -> PublishOutcome {
        await withCheckedContinuation { continuation in
            do throws(KafkaError) {
                let value = job.encoded()
                try producer.send(topic: topic, key: Array(job.recordKey.utf8), value: value,
                                  headers: signing.headers(for: value)) { result in
                    switch result {
                    case .success: continuation.resume(returning: .acknowledged)
                    case .failure(let error) where error.code == .messageTimedOut: continuation.resume(returning: .timedOut)
                    case .failure(let error): continuation.resume(returning: .failed(error))
                    }
                }
            } catch {
                continuation.resume(returning: .failed(error))
            }
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
