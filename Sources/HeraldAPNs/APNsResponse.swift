import Foundation
import HeraldAPNsCore
import HeraldRuntime

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
    /// The `apns-unique-id` header (development environment only): the key to the notification's delivery log in
    /// Apple's Push Notifications Console.
    public var uniqueID: String?

    public init(status: Int, apnsID: String?, reason: APNsReason?, timestamp: Date?) {
        self.status = status
        self.apnsID = apnsID
        self.reason = reason
        self.timestamp = timestamp
    }

    /// 9999-12-31T23:59:59.999Z.
    static let latestTimestampMilliseconds = 253_402_300_799_999.0

    /// Parses status, `apns-id` and an error body (`{"reason": …, "timestamp": <ms>}`).
    public init(status: Int, apnsID: String?, body: [UInt8]) {
        var reason: APNsReason?
        var timestamp: Date?
        if status != 200, !body.isEmpty,
           let object = try? JSONDecoder().decode([String: JSONValue].self, from: Data(body)) {
            reason = object["reason"]?.stringValue.map(APNsReason.init)
            // Milliseconds since 1970; one that no clock could show (negative, past year 9999, not finite) is
            // dropped, not converted: the stores turn it into an Int64, which would trap on every retry.
            if let millis = object["timestamp"]?.numberValue, (0...Self.latestTimestampMilliseconds).contains(millis) {
                timestamp = Date(timeIntervalSince1970: millis / 1000)
            }
        }
        self.init(status: status, apnsID: apnsID, reason: reason, timestamp: timestamp)
    }

    public var disposition: APNsDisposition { APNsDisposition(status: status, reason: reason) }
    public var isDelivered: Bool { disposition == .delivered }
    /// 429 and every 5xx: retry later with backoff.
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
