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
