import Foundation
import HeraldRuntime

/// The `reason` of an APNs error response (or of a GOAWAY frame), as documented by Apple.
public enum APNsReason: Sendable, Hashable, CustomStringConvertible {
    // 400
    case badCollapseID, badDeviceToken, badExpirationDate, badMessageID, badPriority, badTopic,
         deviceTokenNotForTopic, duplicateHeaders, idleTimeout, invalidPushType, missingDeviceToken, missingTopic,
         payloadEmpty, topicDisallowed
    // 403
    case badCertificate, badCertificateEnvironment, expiredProviderToken, forbidden, invalidProviderToken,
         missingProviderToken, unrelatedKeyIDInToken, badEnvironmentKeyInToken
    // 404, 405
    case badPath, methodNotAllowed
    // 410
    case unregistered, expiredToken
    // 413, 429
    case payloadTooLarge, tooManyProviderTokenUpdates, tooManyRequests
    // 500, 503
    case internalServerError, serviceUnavailable, shutdown
    /// A reason this client does not know (kept verbatim).
    case unknown(String)

    private static let known: [String: APNsReason] = [
        "BadCollapseId": .badCollapseID, "BadDeviceToken": .badDeviceToken, "BadExpirationDate": .badExpirationDate,
        "BadMessageId": .badMessageID, "BadPriority": .badPriority, "BadTopic": .badTopic,
        "DeviceTokenNotForTopic": .deviceTokenNotForTopic, "DuplicateHeaders": .duplicateHeaders,
        "IdleTimeout": .idleTimeout, "InvalidPushType": .invalidPushType, "MissingDeviceToken": .missingDeviceToken,
        "MissingTopic": .missingTopic, "PayloadEmpty": .payloadEmpty, "TopicDisallowed": .topicDisallowed,
        "BadCertificate": .badCertificate, "BadCertificateEnvironment": .badCertificateEnvironment,
        "ExpiredProviderToken": .expiredProviderToken, "Forbidden": .forbidden,
        "InvalidProviderToken": .invalidProviderToken, "MissingProviderToken": .missingProviderToken,
        "UnrelatedKeyIdInToken": .unrelatedKeyIDInToken, "BadEnvironmentKeyInToken": .badEnvironmentKeyInToken,
        "BadPath": .badPath, "MethodNotAllowed": .methodNotAllowed, "Unregistered": .unregistered,
        "ExpiredToken": .expiredToken, "PayloadTooLarge": .payloadTooLarge,
        "TooManyProviderTokenUpdates": .tooManyProviderTokenUpdates, "TooManyRequests": .tooManyRequests,
        "InternalServerError": .internalServerError, "ServiceUnavailable": .serviceUnavailable, "Shutdown": .shutdown,
    ]
    private static let names: [APNsReason: String] = Dictionary(uniqueKeysWithValues: known.map { ($1, $0) })

    /// Every reason Apple documents, for tests and metrics.
    public static var allKnown: [APNsReason] { Array(known.values) }

    /// Maps Apple's reason string (`"BadDeviceToken"`) to a case; unknown strings are kept.
    public init(_ text: String) {
        self = Self.known[text] ?? .unknown(text)
    }

    /// The string APNs uses.
    public var description: String {
        if case .unknown(let text) = self { return text }
        return Self.names[self]!
    }
}

/// What the caller should do with a response, from Apple's documented status/reason pairs.
public enum APNsDisposition: Sendable, Equatable {
    /// 200: delivered to APNs.
    case delivered
    /// 429, 500, 503: try again later with backoff.
    case retry
    /// 410 Unregistered/ExpiredToken, 400 BadDeviceToken/DeviceTokenNotForTopic: the token is dead for this topic
    /// and environment; remove it.
    case removeToken
    /// 403 ExpiredProviderToken: refresh the provider token (within the 20-minute rule) and retry.
    case refreshProviderToken
    /// Anything else: our bug, bad input or configuration; do not retry.
    case permanent

    /// Classifies an APNs answer.
    public init(status: Int, reason: APNsReason?) {
        switch (status, reason) {
        case (200, _): self = .delivered
        case (429, _), (500, _), (503, _): self = .retry
        case (410, _), (400, .badDeviceToken), (400, .deviceTokenNotForTopic): self = .removeToken
        case (403, .expiredProviderToken): self = .refreshProviderToken
        default: self = .permanent
        }
    }
}

/// APNs' answer to one request. Non-200 answers are responses too, not thrown errors.
public struct APNsResponse: Sendable, Equatable {
    /// HTTP status.
    public var status: Int
    /// The `apns-id` header: the id sent, or the one APNs generated.
    public var apnsID: String?
    /// The `reason` of an error body.
    public var reason: APNsReason?
    /// 410 only: when APNs learned the token was no longer valid.
    public var timestamp: Date?

    public init(status: Int, apnsID: String?, reason: APNsReason?, timestamp: Date?) {
        self.status = status
        self.apnsID = apnsID
        self.reason = reason
        self.timestamp = timestamp
    }

    /// Parses status, `apns-id` and an error body (`{"reason": …, "timestamp": <ms>}`).
    public init(status: Int, apnsID: String?, body: [UInt8]) {
        var reason: APNsReason?
        var timestamp: Date?
        if status != 200, !body.isEmpty,
           let object = try? JSONDecoder().decode([String: JSONValue].self, from: Data(body)) {
            reason = object["reason"]?.stringValue.map(APNsReason.init)
            if let millis = object["timestamp"]?.numberValue {
                timestamp = Date(timeIntervalSince1970: millis / 1000)
            }
        }
        self.init(status: status, apnsID: apnsID, reason: reason, timestamp: timestamp)
    }

    public var disposition: APNsDisposition { APNsDisposition(status: status, reason: reason) }
    public var isDelivered: Bool { disposition == .delivered }
    /// 429, 500, 503: retry later with backoff.
    public var isRetriable: Bool { disposition == .retry }
    /// The device token should be removed.
    public var isTokenInvalid: Bool { disposition == .removeToken }
    /// 403 ExpiredProviderToken. `APNsClient.send` already refreshed and retried once when the 20-minute rule
    /// allowed it; seeing it here means it did not.
    public var needsProviderTokenRefresh: Bool { disposition == .refreshProviderToken }
}

/// A request that got no APNs answer: refused locally, timed out, or lost with its connection.
public struct APNsError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Code: Sendable, Equatable {
        /// Refused before sending (what APNs would refuse anyway). Never retry.
        case invalidRequest(APNsRequestProblem)
        /// No answer within the request timeout; the stream was reset. Retry.
        case timeout
        /// Could not connect, or the connection was lost with the request in flight. Retry.
        case connectionFailed
        /// The server said (GOAWAY, REFUSED_STREAM) it did not process the request. Retry.
        case notProcessed
        /// The server reset the stream or broke the HTTP/2 protocol. Retry.
        case protocolError
        /// The certificate chain or host name did not verify, or the TLS handshake failed. Configuration: alert.
        case tlsFailure
        /// The server did not select ALPN `h2`. Configuration: alert.
        case http2NotNegotiated
        /// Too many requests already waiting for a free stream. Retry later.
        case queueFull
        /// The client is shutting down (or was shut down). Retry elsewhere.
        case shutdown
        /// The provider token could not be signed with the key. Configuration: alert.
        case providerTokenFailure
        /// A configuration value is unusable (bad URL, unreadable CA file).
        case invalidConfiguration
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    /// True when sending again later may succeed.
    public var isRetriable: Bool {
        switch code {
        case .timeout, .connectionFailed, .notProcessed, .protocolError, .queueFull, .shutdown: true
        case .invalidRequest, .tlsFailure, .http2NotNegotiated, .providerTokenFailure, .invalidConfiguration: false
        }
    }

    /// A short label for metrics and logs.
    public var kind: String {
        switch code {
        case .invalidRequest: "invalid_request"
        case .timeout: "timeout"
        case .connectionFailed: "connection_failed"
        case .notProcessed: "not_processed"
        case .protocolError: "protocol_error"
        case .tlsFailure: "tls_failure"
        case .http2NotNegotiated: "http2_not_negotiated"
        case .queueFull: "queue_full"
        case .shutdown: "shutdown"
        case .providerTokenFailure: "provider_token_failure"
        case .invalidConfiguration: "invalid_configuration"
        }
    }

    public var description: String { "APNs \(kind): \(message)" }
}
