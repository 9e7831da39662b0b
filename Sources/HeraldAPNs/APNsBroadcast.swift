import Foundation
import HeraldAPNsCore
import HeraldRuntime

/// One update published to an iOS 18 broadcast channel: `POST /4/broadcasts/apps/<bundleId>` with
/// `apns-channel-id`, `apns-push-type: liveactivity` and no `apns-topic`. Every device whose Live Activity joined
/// the channel gets it.
public struct APNsBroadcastRequest: Sendable {
    /// Broadcast payloads may be larger than device pushes.
    public static let maximumPayloadSize = 5120

    public var bundleID: String
    /// The channel id APNs returned at creation (base64).
    public var channelID: String
    public var payload: [UInt8]
    /// `nil` means 10.
    public var priority: APNsPriority?
    /// `apns-expiration`; a `.noStorage` channel requires `Date(timeIntervalSince1970: 0)` (APNs answers
    /// BadExpirationDate otherwise), which is what `nil` sends there.
    public var expiration: Date?
    public var storagePolicy: APNsStoragePolicy
    /// `apns-request-id`; APNs generates one when absent.
    public var requestID: UUID?

    public init(bundleID: String, channelID: String, payload: [UInt8], priority: APNsPriority? = nil,
                expiration: Date? = nil, storagePolicy: APNsStoragePolicy, requestID: UUID? = nil) {
        self.bundleID = bundleID
        self.channelID = channelID
        self.payload = payload
        self.priority = priority
        self.expiration = expiration
        self.storagePolicy = storagePolicy
        self.requestID = requestID
    }

    /// The `apns-expiration` value sent, in seconds since 1970: always 0 on a no-storage channel.
    public var expirationSeconds: Int? {
        if storagePolicy == .noStorage { return 0 }
        return expiration.map { Int(max(0, $0.timeIntervalSince1970.rounded(.down))) }
    }

    public func validate() throws(APNsError) {
        try APNsChannelRequest.validate(bundleID: bundleID)
        try APNsChannelRequest.validate(channelID: channelID)
        guard !payload.isEmpty else { throw APNsError(.invalidRequest(.payloadEmpty), "payload is empty") }
        guard payload.count <= Self.maximumPayloadSize else {
            let problem = APNsRequestProblem.payloadTooLarge(size: payload.count, limit: Self.maximumPayloadSize)
            throw APNsError(.invalidRequest(problem), problem.description)
        }
    }
}

/// A channel management request on Apple's management host (`/1/apps/<bundleId>/channels` and `/all-channels`).
public enum APNsChannelRequest: Sendable, Equatable {
    case create(bundleID: String, storagePolicy: APNsStoragePolicy)
    case read(bundleID: String, channelID: String)
    case delete(bundleID: String, channelID: String)
    case list(bundleID: String)

    var bundleID: String {
        switch self {
        case .create(let bundle, _), .read(let bundle, _), .delete(let bundle, _), .list(let bundle): bundle
        }
    }

    /// A short label for metrics and logs.
    public var operation: String {
        switch self {
        case .create: "create"
        case .read: "read"
        case .delete: "delete"
        case .list: "list"
        }
    }

    var method: String {
        switch self {
        case .create: "POST"
        case .read, .list: "GET"
        case .delete: "DELETE"
        }
    }

    var channelID: String? {
        switch self {
        case .read(_, let id), .delete(_, let id): id
        case .create, .list: nil
        }
    }

    var body: [UInt8] {
        guard case .create(_, let policy) = self else { return [] }
        return JSONValue.object(["message-storage-policy": .number(Double(policy.rawValue)),
                                 "push-type": .string("LiveActivity")]).encoded()
    }

    func validate() throws(APNsError) {
        try Self.validate(bundleID: bundleID)
        if let channelID { try Self.validate(channelID: channelID) }
    }

    /// A bundle id goes into the path: letters, digits, '.', '-' only.
    static func validate(bundleID: String) throws(APNsError) {
        guard !bundleID.isEmpty, bundleID.utf8.count <= 155, bundleID.utf8.allSatisfy({ byte in
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte | 0x20) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
                || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "-")
        }) else { throw APNsError(.invalidRequest(.invalidTopic), "invalid bundle id") }
    }

    static func validate(channelID: String) throws(APNsError) {
        guard APNsChannelID.isValid(channelID) else { throw APNsError(.invalidRequest(.invalidChannelID), "invalid channel id") }
    }
}

/// APNs' answer to a channel management request or a broadcast. Non-2xx answers are answers too.
public struct APNsChannelResponse: Sendable, Equatable {
    public var status: Int
    public var reason: APNsReason?
    /// `apns-channel-id`: the new channel's id on a create.
    public var channelID: String?
    /// `apns-request-id`.
    public var requestID: String?
    /// `apns-unique-id` (development only): the key to the Push Notifications Console's log.
    public var uniqueID: String?
    /// A read's `message-storage-policy`.
    public var storagePolicy: APNsStoragePolicy?
    /// A list's channel ids.
    public var channels: [String]?

    public init(status: Int, reason: APNsReason? = nil, channelID: String? = nil, requestID: String? = nil,
                uniqueID: String? = nil, storagePolicy: APNsStoragePolicy? = nil, channels: [String]? = nil) {
        self.status = status
        self.reason = reason
        self.channelID = channelID
        self.requestID = requestID
        self.uniqueID = uniqueID
        self.storagePolicy = storagePolicy
        self.channels = channels
    }

    init(_ raw: RawResponse) {
        self.init(status: raw.status, channelID: raw.channelID, requestID: raw.apnsID, uniqueID: raw.uniqueID)
        guard !raw.body.isEmpty, let object = JSONValue(parsing: raw.body)?.objectValue else { return }
        if (200..<300).contains(raw.status) {
            storagePolicy = object["message-storage-policy"]?.numberValue.flatMap { APNsStoragePolicy(rawValue: Int($0)) }
            channels = object["channels"]?.arrayValue?.compactMap(\.stringValue)
        } else {
            reason = object["reason"]?.stringValue.map(APNsReason.init)
        }
    }

    public var isSuccess: Bool { (200..<300).contains(status) }
    public var disposition: APNsDisposition {
        isSuccess ? .delivered : APNsDisposition(status: status, reason: reason)
    }
}

extension APNsClient {
    /// Publishes one broadcast and returns APNs' answer (any status), with the provider-token refresh and
    /// resend of `send(_:credentials:environment:)`.
    public func publish(_ broadcast: APNsBroadcastRequest, credentials: APNsCredentials,
                        environment: APNsEnvironment) async throws -> APNsChannelResponse {
        try broadcast.validate()
        let endpoint = environment == .production ? broadcastProduction : broadcastSandbox
        let response = try await exchange(credentials: credentials, endpoint: endpoint, body: broadcast.payload,
                                          successBodyLimit: 0) { token in
            Self.broadcastHeaders(broadcast, token: token, endpoint: endpoint)
        }
        broadcastMetrics.broadcasts.labels(String(response.status), response.reason?.metricLabel ?? "").increment()
        return response
    }

    /// Sends one channel management request to the environment's management host.
    public func manage(_ request: APNsChannelRequest, credentials: APNsCredentials,
                       environment: APNsEnvironment) async throws -> APNsChannelResponse {
        try request.validate()
        let endpoint = environment == .production ? manageProduction : manageSandbox
        let response = try await exchange(credentials: credentials, endpoint: endpoint, body: request.body,
                                          successBodyLimit: 1 << 20) { token in
            Self.managementHeaders(request, token: token, endpoint: endpoint)
        }
        broadcastMetrics.channelRequests.labels(request.operation, String(response.status),
                                                response.reason?.metricLabel ?? "").increment()
        return response
    }

    /// The HTTP/2 request `publish` would make, without sending it (the provider token cut short).
    public func preview(_ broadcast: APNsBroadcastRequest, credentials: APNsCredentials,
                        environment: APNsEnvironment) throws(APNsError) -> (headers: [(String, String)], body: [UInt8]) {
        try broadcast.validate()
        let token = try providerTokens.token(for: credentials)
        let endpoint = environment == .production ? broadcastProduction : broadcastSandbox
        return (Self.readable(Self.broadcastHeaders(broadcast, token: token.value, endpoint: endpoint)), broadcast.payload)
    }

    /// Signs (or reuses) the provider token, sends, and once more with a fresh token on 403 ExpiredProviderToken
    /// when the 20-minute rule allows.
    private func exchange(credentials: APNsCredentials, endpoint: APNsEndpoint, body: [UInt8], successBodyLimit: Int,
                          headers: (String) -> HeaderBlock) async throws -> APNsChannelResponse {
        let token = try providerTokens.token(for: credentials)
        let poolKey = PoolKey(credentials, endpoint: endpoint)
        let first = APNsChannelResponse(try await perform(headers(token.value), body: body, poolKey: poolKey,
                                                          successBodyLimit: successBodyLimit))
        guard first.disposition == .refreshProviderToken,
              let fresh = try providerTokens.token(afterRejecting: token, for: credentials) else { return first }
        return APNsChannelResponse(try await perform(headers(fresh.value), body: body, poolKey: poolKey,
                                                     successBodyLimit: successBodyLimit))
    }

    static func broadcastHeaders(_ broadcast: APNsBroadcastRequest, token: String, endpoint: APNsEndpoint) -> HeaderBlock {
        let capacity = 256 + endpoint.authority.utf8.count + broadcast.bundleID.utf8.count + token.utf8.count
            + broadcast.channelID.utf8.count
        return HeaderBlock(capacity: capacity) { headers in
            headers.add(":method", "POST")
            headers.add(":scheme", "https")
            headers.add(":authority", endpoint.authority)
            headers.add(":path", "/4/broadcasts/apps/", broadcast.bundleID)
            headers.add("authorization", "bearer ", token)
            headers.add("apns-channel-id", broadcast.channelID)
            headers.add("apns-push-type", "liveactivity")
            headers.add("apns-priority", (broadcast.priority ?? .immediate).rawValue)
            if let expiration = broadcast.expirationSeconds { headers.add("apns-expiration", expiration) }
            if let requestID = broadcast.requestID { headers.add("apns-request-id", requestID) }
            headers.add("content-length", broadcast.payload.count)
        }
    }

    static func managementHeaders(_ request: APNsChannelRequest, token: String, endpoint: APNsEndpoint) -> HeaderBlock {
        let body = request.body
        let capacity = 256 + endpoint.authority.utf8.count + request.bundleID.utf8.count + token.utf8.count
            + (request.channelID?.utf8.count ?? 0)
        return HeaderBlock(capacity: capacity) { headers in
            headers.add(":method", request.method)
            headers.add(":scheme", "https")
            headers.add(":authority", endpoint.authority)
            if case .list = request {
                headers.add(":path", "/1/apps/", request.bundleID + "/all-channels")
            } else {
                headers.add(":path", "/1/apps/", request.bundleID + "/channels")
            }
            headers.add("authorization", "bearer ", token)
            if let channelID = request.channelID { headers.add("apns-channel-id", channelID) }
            if !body.isEmpty {
                headers.add("content-type", "application/json")
                headers.add("content-length", body.count)
            }
        }
    }
}

/// The client's broadcast metrics.
struct BroadcastMetrics: Sendable {
    let broadcasts: CounterFamily
    let channelRequests: CounterFamily

    init(_ registry: MetricsRegistry) {
        broadcasts = registry.counter("herald_broadcast_requests_total",
                                      help: "Broadcasts sent to APNs channels, by HTTP status and reason",
                                      labels: ["status", "reason"])
        channelRequests = registry.counter("herald_broadcast_channel_requests_total",
                                           help: "APNs channel management requests, by operation, HTTP status and reason",
                                           labels: ["operation", "status", "reason"])
    }
}
