import Foundation
import HeraldCore
import HeraldCrypto
import HeraldHTTP
import HeraldRuntime
import HeraldStore

/// `…/subscriptions`: devices subscribe their tokens to channels (device keys).
///
/// The hot path of the service (every app launch posts here), so bodies are parsed and answers written with
/// `JSONValue`'s own parser and serialiser rather than Foundation's coders, which cost a quarter of a request.
struct SubscriptionsAPI: Sendable {
    let store: SubscriptionStore
    let gate: Gatekeeper
    let logger: Logger

    func register(on router: inout Router) {
        let path = "/v1/apps/{appID}/subscriptions"
        // The rate-limit count rides in the upsert script: one Redis round trip per subscription.
        router.post(path, gate.selfCountingEndpoint(.device, device: Self.namedDevice) { request, admission, meter in
            let input = try SubscriptionInput(try request.jsonBody())
            if admission.app.isPrivate(channel: input.channel) { try checkGrant(request, input, app: admission.app) }
            let subscription: Subscription, created: Bool
            switch try await store.upsert(app: admission.app.id, input, counting: meter.window(device: input.deviceToken)) {
            case .rateLimited(let decision):
                throw gate.refuse(meter, decision)
            case .tooMany(let decision):
                meter.record(decision)
                throw HTTPError(status: 409, code: "too_many_subscriptions",
                                message: "the device already has \(store.maxPerDevice) subscriptions (HERALD_MAX_SUBSCRIPTIONS_PER_DEVICE); remove some first",
                                field: "channel")
            case .stored(let stored, let isNew, let decision):
                meter.record(decision)
                (subscription, created) = (stored, isNew)
            }
            if logger.minimumLevel <= .debug {
                logger.debug(created ? "subscription created" : "subscription updated",
                            ["app": admission.app.id, "token": Redaction.tag(input.deviceToken),
                             "token.type": input.tokenType.rawValue, "request.id": request.requestID])
            }
            return .json(bytes: Self.json(subscription, encodedMetadata: input.encodedMetadata),
                         status: created ? 201 : 200)
        })
        router.get(path, gate.endpoint(.device, device: Self.queryDevice) { request, admission in
            guard let raw = request.query["deviceToken"] else { throw ValidationError.missing("deviceToken") }
            let token = try DeviceToken.normalized(raw, field: "deviceToken")
            let limit = try Self.pageLimit(request)
            let page = try await store.list(app: admission.app.id, deviceToken: token,
                                            after: try Self.cursor(request), limit: limit)
            return .json(bytes: Self.json(list: page.subscriptions, after: page.next))
        })
        router.delete(path, body: .json, gate.endpoint(.device, device: Self.bodyDevice) { request, admission in
            let removal = try SubscriptionRemoval(try request.jsonBody())
            let removed = try await store.remove(app: admission.app.id, removal)
            return .json(bytes: Array("{\"removed\":\(removed)}".utf8))
        })
        // A producer closes a channel (an order that was delivered): every subscription of it goes.
        router.delete("/v1/apps/{appID}/channels/{channel}", gate.endpoint(.producer) { request, admission in
            let channel = try request.pathParameter("channel")
            try Channel.validate(channel)
            let removed = try await store.removeChannel(app: admission.app.id, channel: channel)
            logger.info("channel closed", ["app": admission.app.id, "removed": String(removed), "request.id": request.requestID])
            return .json(bytes: Array("{\"removed\":\(removed)}".utf8))
        })
    }

    static let maxPageLimit = 500

    /// `limit`: 1–500, default 100.
    static func pageLimit(_ request: HTTPRequest) throws(ValidationError) -> Int {
        guard let raw = request.query["limit"] else { return 100 }
        guard let limit = Int(raw), (1...maxPageLimit).contains(limit) else {
            throw .invalid("limit", "limit must be a whole number from 1 to \(maxPageLimit)")
        }
        return limit
    }

    /// The opaque `cursor` of a page: base64url of the last subscription id of the page before.
    static func cursor(_ request: HTTPRequest) throws(ValidationError) -> String? {
        guard let raw = request.query["cursor"] else { return nil }
        guard let bytes = Base64URL.decode(raw), bytes.count == 12 else {
            throw .invalid("cursor", "cursor must be a nextCursor this API returned")
        }
        return Hex.encode(bytes)
    }

    static func cursor(after id: String) -> String { Base64URL.encode(Hex.decode(id) ?? []) }

    /// A private channel's subscription needs a grant for it, in the body (`channelGrant`) or the
    /// `X-Herald-Channel-Grant` header; refused before anything is stored.
    private func checkGrant(_ request: HTTPRequest, _ input: SubscriptionInput, app: App) throws(HTTPError) {
        guard let grant = input.channelGrant ?? request.headers["X-Herald-Channel-Grant"] else {
            throw HTTPError(status: 403, code: "channel_grant_required",
                            message: "\(input.channel) is a private channel: subscribing needs a channel grant from the app's backend",
                            field: "channelGrant")
        }
        do throws(ChannelGrant.Refusal) {
            try ChannelGrant.check(grant, channel: input.channel, app: app, now: Date().timeIntervalSince1970,
                                   skew: Double(gate.clockSkew.components.seconds))
        } catch {
            throw HTTPError(status: 403, code: "invalid_channel_grant", message: "the channel grant is not valid: \(error)",
                            field: "channelGrant")
        }
    }

    /// The device a request is about, for its rate limit (nil when absent or malformed: the handler refuses it).
    @Sendable static func queryDevice(_ request: HTTPRequest) -> String? {
        request.query["deviceToken"].flatMap { try? DeviceToken.normalized($0, field: "deviceToken") }
    }

    /// The valid device token a subscription body names, even when the rest of it is refused: the refusal counts
    /// in that device's window, not in the key's one window for requests that name no device.
    @Sendable static func namedDevice(_ request: HTTPRequest) -> String? {
        guard let token = (try? request.jsonBody())?["deviceToken"]?.stringValue else { return nil }
        return try? DeviceToken.normalized(token, field: "deviceToken")
    }

    @Sendable static func bodyDevice(_ request: HTTPRequest) -> String? {
        (try? request.jsonBody()).flatMap { try? SubscriptionRemoval($0) }?.deviceToken
    }

    /// A subscription as the API shows it (schemas/openapi.yaml `Subscription`): `activityID` and `metadata` only
    /// when set. Written field by field: no dictionary to build and sort per request. `encodedMetadata`, when
    /// given, is the subscription's metadata already encoded (`SubscriptionInput.encodedMetadata`), copied as is.
    static func json(_ subscription: Subscription, encodedMetadata: [UInt8]? = nil, into out: inout [UInt8]) {
        func field(_ name: StaticString, _ value: String, first: Bool = false) {
            out += (first ? "{\"" : ",\"").utf8
            out += UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount)
            out += "\":".utf8
            JSONValue.appendQuoted(value, to: &out)
        }
        field("id", subscription.id, first: true)
        field("channel", subscription.channel)
        field("deviceToken", subscription.deviceToken)
        field("tokenType", subscription.tokenType.rawValue)
        field("environment", subscription.environment.rawValue)
        if let activityID = subscription.activityID { field("activityID", activityID) }
        if let encodedMetadata {
            out += #","metadata":"#.utf8
            out += encodedMetadata
        } else if let metadata = subscription.metadata {
            out += #","metadata":"#.utf8
            metadata.serialize(into: &out)
        }
        field("createdAt", subscription.createdAt)
        field("updatedAt", subscription.updatedAt)
        out.append(UInt8(ascii: "}"))
    }

    static func json(_ subscription: Subscription, encodedMetadata: [UInt8]? = nil) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(384 + (encodedMetadata?.count ?? 0))
        json(subscription, encodedMetadata: encodedMetadata, into: &out)
        return out
    }

    /// A page's answer holds at most about this many bytes: an answer its client does not read stays in memory
    /// until the connection times out, so with `maxPageLimit` subscriptions of 4 KiB metadata each (2 MB) a
    /// thousand such connections would take gigabytes.
    static let maxPageBytes = 128 * 1024

    /// The page's answer, its `nextCursor` after `next` (the id of the last subscription read), or after the last
    /// subscription it holds when the page stopped early at `maxPageBytes`.
    static func json(list subscriptions: [Subscription], after next: String?) -> [UInt8] {
        var out = Array(#"{"subscriptions":["#.utf8)
        var cursorID = next
        for (index, subscription) in subscriptions.enumerated() {
            if index > 0 {
                guard out.count < maxPageBytes else {
                    cursorID = subscriptions[index - 1].id
                    break
                }
                out.append(UInt8(ascii: ","))
            }
            json(subscription, into: &out)
        }
        out += "]".utf8
        if let nextCursor = cursorID.map(cursor(after:)) {
            out += #","nextCursor":"#.utf8
            JSONValue.appendQuoted(nextCursor, to: &out)
        }
        out += "}".utf8
        return out
    }
}
