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
    /// The two series of `herald_ingest_activity_registrations_total`, looked up once: `labels(_:)` per request
    /// builds an array and takes the family's lock.
    let registrations: (new: Counter, renewed: Counter) = {
        let family = MetricsRegistry.shared.counter("herald_ingest_activity_registrations_total",
                                                    help: "Live Activity registrations by outcome.", labels: ["outcome"])
        return (family.labels("new"), family.labels("renewed"))
    }()

    func register(on router: inout Router) {
        // The rate-limit count rides in the registration script: one Redis round trip per registration.
        router.post("/api/v1/activities/register",
                    gate.selfCountingEndpoint(.device, appFromPath: false, oauth: true, device: Self.namedPushToken,
                                              deviceSlot: .activityToken, handle))
        router.post("/v1/apps/{appID}/activities/register",
                    gate.selfCountingEndpoint(.device, oauth: true, device: Self.namedPushToken, deviceSlot: .activityToken,
                                              handle))
    }

    /// The valid push token a registration names, even when the rest of it is refused: the refusal counts in that
    /// token's window, not in the key's one window for requests that name no token.
    @Sendable static func namedPushToken(_ request: HTTPRequest) -> String? {
        guard let token = (try? request.jsonBody())?["push_token"]?.stringValue else { return nil }
        return try? DeviceToken.normalized(token, field: "push_token")
    }

    private func handle(_ request: HTTPRequest, _ admission: Gatekeeper.Admission,
                        _ meter: Gatekeeper.Meter) async throws -> HTTPResponse {
        let input = try ActivityRegistrationInput(try request.jsonBody(), app: admission.app)
        let registration: ActivityRegistration, renewed: Bool
        switch try await store.register(app: admission.app.id, user: admission.principal.user, input,
                                        counting: meter.window(device: input.pushToken, in: .activityToken)) {
        case .rateLimited(let decision):
            throw gate.refuse(meter, decision)
        case .stored(let stored, let wasRenewed, let decision):
            meter.record(decision)
            (registration, renewed) = (stored, wasRenewed)
        }
        (renewed ? registrations.renewed : registrations.new).increment()
        if logger.minimumLevel <= .debug {
            logger.debug(renewed ? "activity registration renewed" : "activity registered",
                        ["app": admission.app.id, "token": Redaction.tag(input.pushToken), "post": input.postIDHash,
                         "request.id": request.requestID])
        }
        return .json(bytes: Self.body(registration), status: 201)
    }

    /// `{"data": {id, post_id_hash, apns_environment, bundle_id, created_at, last_seen_at}}`: never the push
    /// token. Written by hand because this endpoint is hot (`JSONEncoder`, then per-scalar escaping, were a sizeable
    /// share of its time); no value needs escaping: the id and post hash are hex, the environment an enum, the
    /// bundle id checked to be letters, digits, '-' and '.', the times RFC 3339.
    /// Appended straight into one byte buffer: no intermediate strings.
    static func body(_ r: ActivityRegistration) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(192 + r.postIDHash.utf8.count + r.bundleID.utf8.count)
        out += #"{"data":{"id":""#.utf8
        out += r.id.utf8
        out += #"","post_id_hash":""#.utf8
        out += r.postIDHash.utf8
        out += #"","apns_environment":""#.utf8
        out += r.environment.rawValue.utf8
        out += #"","bundle_id":""#.utf8
        out += r.bundleID.utf8
        out += #"","created_at":""#.utf8
        out += r.createdAt.utf8
        out += #"","last_seen_at":""#.utf8
        out += r.lastSeenAt.utf8
        out += #""}}"#.utf8
        return out
    }
}
