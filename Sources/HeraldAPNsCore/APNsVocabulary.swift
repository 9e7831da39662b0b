/// Apple's two APNs environments: which host a token belongs to.
public enum APNsEnvironment: String, Sendable, Codable, Hashable, CaseIterable {
    case production, sandbox
}

/// The `apns-push-type` header. It must match the payload (e.g. `background` for content-available only).
public enum APNsPushType: String, Sendable, Codable, CaseIterable {
    case alert, background, location, voip, complication, fileprovider, mdm, liveactivity, pushtotalk, widgets,
         controls
}

/// The `apns-priority` header.
public enum APNsPriority: Int, Sendable, CaseIterable {
    /// 10: deliver immediately (the default; not allowed for background pushes).
    case immediate = 10
    /// 5: deliver when power considerations allow (required for background pushes).
    case powerConsiderate = 5
    /// 1: prioritise the device's power over everything else.
    case low = 1
}

/// Whether APNs keeps a broadcast channel's most recent message for devices that were offline
/// (`message-storage-policy`). Fixed when the channel is created.
public enum APNsStoragePolicy: Int, Sendable, Codable, CaseIterable {
    /// Nothing is stored: a higher publishing budget; broadcasts must carry `apns-expiration: 0`.
    case noStorage = 0
    /// The most recent message is kept for up to 8 hours.
    case mostRecentMessage = 1

    /// The name Herald's API and job records use.
    public var name: String { self == .noStorage ? "noStorage" : "mostRecentMessage" }

    public init?(name: String) {
        guard let policy = Self.allCases.first(where: { $0.name == name }) else { return nil }
        self = policy
    }
}
