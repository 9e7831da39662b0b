/// The `reason` of an APNs error response (or of a GOAWAY frame), as documented by Apple.
public enum APNsReason: Sendable, Hashable, CustomStringConvertible {
    // 400
    case badCollapseID, badDeviceToken, badExpirationDate, badMessageID, badPriority, badTopic,
         deviceTokenNotForTopic, duplicateHeaders, idleTimeout, invalidPushType, missingDeviceToken, missingTopic,
         payloadEmpty, topicDisallowed
    // 400, broadcast (iOS 18 channels) only
    case badChannelID, badRequestParams, badRequestPayload, cannotCreateChannelConfig, channelNotRegistered,
         featureNotEnabled, missingChannelID, missingPushType
    // 403
    case badCertificate, badCertificateEnvironment, expiredProviderToken, forbidden, invalidProviderToken,
         missingProviderToken, unrelatedKeyIDInToken, badEnvironmentKeyInToken, topicMismatch
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
        "BadChannelId": .badChannelID, "BadRequestParams": .badRequestParams, "BadRequestPayload": .badRequestPayload,
        "CannotCreateChannelConfig": .cannotCreateChannelConfig, "ChannelNotRegistered": .channelNotRegistered,
        "FeatureNotEnabled": .featureNotEnabled, "MissingChannelId": .missingChannelID,
        "MissingPushType": .missingPushType, "TopicMismatch": .topicMismatch,
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

    /// A metric label: Apple's string for a documented reason, `other` for any other, so that a server sending
    /// made-up reasons cannot grow the metric without bound.
    public var metricLabel: String {
        if case .unknown = self { return "other" }
        return description
    }
}

/// What the caller should do with a response, from Apple's documented status/reason pairs.
public enum APNsDisposition: Sendable, Equatable {
    /// 200: delivered to APNs.
    case delivered
    /// 429, every 5xx (Apple's 500 and 503, or a 502/504 from a proxy on the way) and 400 IdleTimeout (the
    /// connection's idle time ran out, not the push's fault): try again later with backoff.
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
        case (429, _), (500...599, _), (400, .idleTimeout): self = .retry
        case (410, _), (400, .badDeviceToken), (400, .deviceTokenNotForTopic): self = .removeToken
        case (403, .expiredProviderToken): self = .refreshProviderToken
        default: self = .permanent
        }
    }
}
