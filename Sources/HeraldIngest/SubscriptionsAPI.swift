import HeraldCore
import HeraldCrypto
import HeraldHTTP
import HeraldRuntime
import HeraldStore

/// `…/subscriptions`: devices subscribe their tokens to channels (device keys).
struct SubscriptionsAPI: Sendable {
    let store: SubscriptionStore
    let gate: Gatekeeper
    let logger: Logger

    func register(on router: inout Router) {
        let path = "/v1/apps/{appID}/subscriptions"
        router.post(path, gate.endpoint(.device) { request, admission in
            let input = try SubscriptionInput(request.decodeJSON(JSONValue.self))
            let (subscription, created) = try await store.upsert(app: admission.app.id, input)
            logger.info(created ? "subscription created" : "subscription updated",
                        ["app": admission.app.id, "token": Redaction.tag(input.deviceToken),
                         "token.type": input.tokenType.rawValue, "request.id": request.requestID])
            return try .json(subscription, status: created ? 201 : 200)
        })
        router.get(path, gate.endpoint(.device) { request, admission in
            guard let raw = request.query["deviceToken"] else { throw ValidationError.missing("deviceToken") }
            let token = try DeviceToken.normalized(raw, field: "deviceToken")
            return try .json(SubscriptionList(subscriptions: try await store.list(app: admission.app.id, deviceToken: token)))
        })
        router.delete(path, body: .json, gate.endpoint(.device) { request, admission in
            let removal = try SubscriptionRemoval(request.decodeJSON(JSONValue.self))
            let removed = try await store.remove(app: admission.app.id, removal)
            return try .json(Removed(removed: removed))
        })
    }

    struct SubscriptionList: Encodable { var subscriptions: [Subscription] }
    struct Removed: Encodable { var removed: Int }
}
