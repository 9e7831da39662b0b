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
            let body = try request.decodeJSON(JSONValue.self)
            let job = try EventIntake.channelEvent(body, appID: admission.app.id, jobID: Self.idempotencyKey(request))
            return try await publish(job, clientChoseID: Self.clientChoseID(request, body))
        })
        router.post("/v1/apps/{appID}/activities/{postIdHash}/events", gate.endpoint(.producer) { request, admission in
            let body = try request.decodeJSON(JSONValue.self)
            let job = try EventIntake.activityEvent(body, appID: admission.app.id,
                                                    postIDHash: try request.pathParameter("postIdHash"),
                                                    jobID: Self.idempotencyKey(request))
            return try await publish(job, clientChoseID: Self.clientChoseID(request, body))
        })
        router.post("/v1/apps/{appID}/devices/{deviceToken}/push", gate.endpoint(.producer) { request, admission in
            let body = try request.decodeJSON(JSONValue.self)
            let job = try EventIntake.devicePush(body, appID: admission.app.id,
                                                 deviceToken: try request.pathParameter("deviceToken"),
                                                 jobID: Self.idempotencyKey(request))
            return try await publish(job, clientChoseID: Self.clientChoseID(request, body))
        })
    }

    /// Publishes once per client-chosen id (24 h window) and answers 202 with the job id after the ack.
    private func publish(_ job: PushJob, clientChoseID: Bool) async throws -> HTTPResponse {
        if clientChoseID {
            switch try await idempotency.claim(app: job.appId, id: job.id) {
            case .claimed: break
            case .alreadyPublished: return try .json(Accepted(jobId: job.id), status: 202)
            case .inProgress:
                throw HTTPError(status: 409, code: "in_progress", message: "a request with this id is being published",
                                field: "id")
            }
        }
        let start = ContinuousClock.now
        do {
            _ = try await producer.send(topic: topic, key: job.recordKey, value: job.encoded())
        } catch {
            publishFailures.increment()
            if clientChoseID { try? await idempotency.release(app: job.appId, id: job.id) }
            throw error
        }
        publishLatency.observe(since: start)
        published.labels(job.target.kind.rawValue).increment()
        if clientChoseID {
            // Published already: if Redis fails here the claim expires and a retry may publish again (at least once).
            do { try await idempotency.complete(app: job.appId, id: job.id) } catch {
                logger.warning("idempotency marker not saved", ["job.id": job.id, "error": "\(error)"])
            }
        }
        return try .json(Accepted(jobId: job.id), status: 202)
    }

    private static func idempotencyKey(_ request: HTTPRequest) -> String? { request.headers["Idempotency-Key"] }

    private static func clientChoseID(_ request: HTTPRequest, _ body: JSONValue) -> Bool {
        idempotencyKey(request) != nil || body["id"] != nil
    }

    struct Accepted: Encodable { var jobId: String }
}
