import HeraldAPNsCore
import HeraldRuntime

/// A device's subscription to a channel, as stored and as the API returns it.
public struct Subscription: Sendable, Codable, Equatable {
    public var id: String
    public var channel: String
    public var deviceToken: String
    public var tokenType: TokenType
    public var environment: APNsEnvironment
    public var activityID: String?
    public var metadata: JSONValue?
    public var createdAt: String
    public var updatedAt: String

    public init(id: String, channel: String, deviceToken: String, tokenType: TokenType, environment: APNsEnvironment,
                activityID: String?, metadata: JSONValue?, createdAt: String, updatedAt: String) {
        (self.id, self.channel, self.deviceToken, self.tokenType, self.environment) =
            (id, channel, deviceToken, tokenType, environment)
        (self.activityID, self.metadata, self.createdAt, self.updatedAt) = (activityID, metadata, createdAt, updatedAt)
    }
}

/// Channel names: opaque, 1–255 characters, none of them a control character (U+0000–U+001F, U+007F–U+009F).
public enum Channel {
    /// Counted in Unicode code points, as JSON Schema's `maxLength` counts (the OpenAPI document says 255).
    public static let maxLength = 255

    public static func validate(_ channel: String, field: String = "channel") throws(ValidationError) {
        guard !channel.isEmpty else { throw .missing(field) }
        // Printable ASCII, the usual case, without looking up each scalar's Unicode category.
        if channel.utf8.count <= maxLength, channel.utf8.allSatisfy({ $0 >= 0x20 && $0 < 0x7F }) { return }
        guard channel.unicodeScalars.count <= maxLength else {
            throw .invalid(field, "\(field) must be at most \(maxLength) characters")
        }
        guard channel.unicodeScalars.allSatisfy({ $0.properties.generalCategory != .control && $0 != "\u{7f}" }) else {
            throw .invalid(field, "\(field) must contain only printable characters")
        }
    }
}

/// `POST /v1/apps/{appID}/subscriptions`, checked.
public struct SubscriptionInput: Sendable, Equatable {
    public static let maxMetadataBytes = 4096
    static let fields: Set<String> = ["channel", "deviceToken", "tokenType", "environment", "activityID", "metadata",
                                      "previousToken", "channelGrant"]

    public var channel: String
    public var deviceToken: String
    public var tokenType: TokenType
    public var environment: APNsEnvironment
    public var activityID: String?
    /// Setting it also sets `encodedMetadata`.
    public var metadata: JSONValue? {
        didSet { encodedMetadata = metadata?.encoded() }
    }
    /// `metadata` as compact JSON with sorted keys, as stored: encoded once, when checking its size, and reused
    /// for Redis and the response.
    public private(set) var encodedMetadata: [UInt8]?
    public var previousToken: String?
    /// The channel grant (a JWT) for a private channel; not stored.
    public var channelGrant: String?

    public init(_ body: JSONValue) throws(ValidationError) {
        let fields = try FieldReader(body, allowed: Self.fields)
        channel = try fields.requiredString("channel")
        try Channel.validate(channel)
        deviceToken = try DeviceToken.normalized(try fields.requiredString("deviceToken"), field: "deviceToken")
        guard let tokenType = try fields.enumeration("tokenType", TokenType.self) else { throw .missing("tokenType") }
        self.tokenType = tokenType
        environment = try fields.enumeration("environment", APNsEnvironment.self) ?? .production
        activityID = try fields.string("activityID")
        if let activityID {
            guard !activityID.isEmpty, activityID.unicodeScalars.count <= 255 else {
                throw .invalid("activityID", "activityID must be 1–255 characters")
            }
        }
        if tokenType == .liveActivityUpdate, activityID == nil {
            throw ValidationError(code: "missing_field", message: "activityID is required for liveactivity-update",
                                  field: "activityID")
        }
        metadata = try fields.object("metadata")
        encodedMetadata = metadata?.encoded()
        if let encodedMetadata, encodedMetadata.count > Self.maxMetadataBytes {
            throw .invalid("metadata", "metadata must be at most \(Self.maxMetadataBytes) bytes of JSON")
        }
        previousToken = try fields.string("previousToken").map { (raw) throws(ValidationError) in
            try DeviceToken.normalized(raw, field: "previousToken")
        }
        channelGrant = try fields.string("channelGrant")
    }
}

/// `DELETE /v1/apps/{appID}/subscriptions`, checked: one subscription, or all of a device's.
public struct SubscriptionRemoval: Sendable, Equatable {
    public var deviceToken: String
    /// Both set (one subscription) or both nil (every subscription of the device).
    public var channel: String?
    public var tokenType: TokenType?

    static let fields: Set<String> = ["deviceToken", "channel", "tokenType"]

    public init(_ body: JSONValue) throws(ValidationError) {
        let fields = try FieldReader(body, allowed: Self.fields)
        deviceToken = try DeviceToken.normalized(try fields.requiredString("deviceToken"), field: "deviceToken")
        channel = try fields.string("channel")
        if let channel { try Channel.validate(channel) }
        tokenType = try fields.enumeration("tokenType", TokenType.self)
        if (channel == nil) != (tokenType == nil) {
            throw ValidationError(code: "invalid_field",
                                  message: "channel and tokenType go together: give both to remove one subscription, neither to remove all",
                                  field: channel == nil ? "channel" : "tokenType")
        }
    }
}
