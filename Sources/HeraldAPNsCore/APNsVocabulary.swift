/// Apple's two APNs environments: which host a token belongs to.
public enum APNsEnvironment: String, Sendable, Codable, Hashable, CaseIterable {
    case production, sandbox
}

/// The `apns-push-type` header. It must match the payload (e.g. `background` for content-available only).
public enum APNsPushType: String, Sendable, Codable, CaseIterable {
    case alert, background, location, voip, complication, fileprovider, mdm, liveactivity, pushtotalk, widgets,
         controls

    /// What Herald appends to the bundle id for the `apns-topic` of this push type; nil for the bare bundle id (or,
    /// for `mdm`, the MDM topic). The simulator keeps its own copy of Apple's table, to check this one.
    public var topicSuffix: String? {
        switch self {
        case .alert, .background, .mdm: nil
        case .location: ".location-query"
        case .voip: ".voip"
        case .complication: ".complication"
        case .fileprovider: ".pushkit.fileprovider"
        case .liveactivity: ".push-type.liveactivity"
        case .pushtotalk: ".voip-ptt"
        case .widgets: ".push-type.widgets"
        case .controls: ".push-type.controls"
        }
    }
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

/// An iOS 18 broadcast channel id as APNs returns it: base64 (standard or URL-safe) of a length APNs does not
/// promise. Checked before it goes into `apns-channel-id` or a push-to-start's `input-push-channel`.
public enum APNsChannelID {
    public static let maxLength = 256

    public static func isValid(_ id: String) -> Bool {
        (1...maxLength).contains(id.utf8.count) && id.utf8.allSatisfy { byte in
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte | 0x20) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
                || byte == UInt8(ascii: "+") || byte == UInt8(ascii: "/") || byte == UInt8(ascii: "=")
                || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_")
        }
    }
}
