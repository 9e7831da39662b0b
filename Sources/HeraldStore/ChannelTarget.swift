import HeraldCore

/// What a channel fan-out needs of one subscription.
public struct ChannelTarget: Sendable, Equatable {
    public var deviceToken: String
    public var tokenType: TokenType
    public var environment: APNsEnvironment
    /// The Live Activity a `liveactivity-update` subscription is for, if it names one.
    public var activityID: String?
    /// When the subscription expires (UNIX seconds) unless renewed; nil: never.
    public var expiresAt: Int64?

    public init(deviceToken: String, tokenType: TokenType, environment: APNsEnvironment, activityID: String?,
                expiresAt: Int64? = nil) {
        (self.deviceToken, self.tokenType, self.environment, self.activityID, self.expiresAt) =
            (deviceToken, tokenType, environment, activityID, expiresAt)
    }

    /// The channel index's value for this subscription: one letter for the token type (`a` alert, `s`
    /// liveactivity-start, `u` liveactivity-update), one for the environment (`p` production, `s` sandbox), then
    /// `~<expiresAt>~` when it expires, the token (hex), then `:` and the activityID when there is one. The token is
    /// hex, so the first `:` ends it and the activityID (any text) is the rest, whatever it holds.
    var encoded: String {
        var text = ""
        text.reserveCapacity(16 + deviceToken.utf8.count + (activityID?.utf8.count ?? 0))
        text.unicodeScalars.append(Unicode.Scalar(Self.code(of: tokenType)))
        text.unicodeScalars.append(Unicode.Scalar(environment == .production ? UInt8(ascii: "p") : UInt8(ascii: "s")))
        if let expiresAt {
            text += "~"
            text += String(expiresAt)
            text += "~"
        }
        text += deviceToken
        if let activityID {
            text += ":"
            text += activityID
        }
        return text
    }

    /// From `encoded`'s bytes; nil when they are not in that form.
    init?(encoded bytes: [UInt8]) {
        guard bytes.count > 2 else { return nil }
        let tokenType: TokenType
        switch bytes[0] {
        case UInt8(ascii: "a"): tokenType = .alert
        case UInt8(ascii: "s"): tokenType = .liveActivityStart
        case UInt8(ascii: "u"): tokenType = .liveActivityUpdate
        default: return nil
        }
        let environment: APNsEnvironment
        switch bytes[1] {
        case UInt8(ascii: "p"): environment = .production
        case UInt8(ascii: "s"): environment = .sandbox
        default: return nil
        }
        var start = 2, expiresAt: Int64?
        if bytes[2] == UInt8(ascii: "~") {
            guard let end = bytes[3...].firstIndex(of: UInt8(ascii: "~")),
                  let seconds = Int64(String(decoding: bytes[3..<end], as: UTF8.self)) else { return nil }
            (start, expiresAt) = (end + 1, seconds)
        }
        let separator = bytes[start...].firstIndex(of: UInt8(ascii: ":")) ?? bytes.endIndex
        guard separator > start else { return nil }
        let activityID = separator + 1 < bytes.endIndex
            ? String(decoding: bytes[(separator + 1)...], as: UTF8.self) : nil
        self.init(deviceToken: String(decoding: bytes[start..<separator], as: UTF8.self), tokenType: tokenType,
                  environment: environment, activityID: activityID, expiresAt: expiresAt)
    }

    private static func code(of tokenType: TokenType) -> UInt8 {
        switch tokenType {
        case .alert: UInt8(ascii: "a")
        case .liveActivityStart: UInt8(ascii: "s")
        case .liveActivityUpdate: UInt8(ascii: "u")
        }
    }
}
