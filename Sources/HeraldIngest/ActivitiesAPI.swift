import HeraldCore
import HeraldCrypto
import HeraldHTTP
import HeraldRuntime
import HeraldStore

/// Live Activity push-token registration: `POST /api/v1/activities/register` (app from the key or token) and
/// `POST /v1/apps/{appID}/activities/register`. Takes device keys and OAuth 2 access tokens.
struct ActivitiesAPI: Sendable {
    let store: ActivityStore
    let gate: Gatekeeper
    let logger: Logger
    let registrations = MetricsRegistry.shared.counter("herald_ingest_activity_registrations_total",
                                                       help: "Live Activity registrations by outcome.", labels: ["outcome"])

    func register(on router: inout Router) {
        router.post("/api/v1/activities/register", gate.endpoint(.device, appFromPath: false, oauth: true, handle))
        router.post("/v1/apps/{appID}/activities/register", gate.endpoint(.device, oauth: true, handle))
    }

    private func handle(_ request: HTTPRequest, _ admission: Gatekeeper.Admission) async throws -> HTTPResponse {
        let input = try ActivityRegistrationInput(request.decodeJSON(JSONValue.self), app: admission.app)
        let (registration, renewed) = try await store.register(app: admission.app.id, user: admission.principal.user, input)
        registrations.labels(renewed ? "renewed" : "new").increment()
        logger.info(renewed ? "activity registration renewed" : "activity registered",
                    ["app": admission.app.id, "token": Redaction.tag(input.pushToken), "post": input.postIDHash,
                     "request.id": request.requestID])
        return try .json(Envelope(data: Body(registration)), status: 201)
    }

    /// The response body: never the push token.
    struct Body: Encodable {
        var id: String
        var post_id_hash: String
        var apns_environment: String
        var bundle_id: String
        var created_at: String
        var last_seen_at: String

        init(_ r: ActivityRegistration) {
            (id, post_id_hash, apns_environment, bundle_id, created_at, last_seen_at) =
                (r.id, r.postIDHash, r.environment.rawValue, r.bundleID, r.createdAt, r.lastSeenAt)
        }
    }

    struct Envelope: Encodable { var data: Body }
}
