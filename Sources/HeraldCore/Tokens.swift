import HeraldCrypto
import HeraldRuntime
@_exported import HeraldAPNsCore

/// What a device token is for (the subscription API's `tokenType`).
public enum TokenType: String, Sendable, Codable, CaseIterable {
    /// A regular device token: alert (and background) notifications.
    case alert
    /// A push-to-start token for one Live Activity attributes type.
    case liveActivityStart = "liveactivity-start"
    /// A Live Activity's own update token.
    case liveActivityUpdate = "liveactivity-update"
}

/// Rules for the hex strings APNs uses as device and Live Activity tokens.
public enum DeviceToken {
    /// Apple's tokens are 32 bytes today and documented as variable length; accept 8–100 bytes.
    public static let hexLengths = 16...200

    /// What a Kafka record key says instead of the token (a credential): the lowercase hex SHA-256 of the
    /// (lowercase hex) token, stable so one device's records share a partition.
    public static func keyHash(_ token: String) -> String { SHA256.hex(token) }

    /// The token in lowercase, or a validation error naming `field`.
    public static func normalized(_ raw: String, field: String) throws(ValidationError) -> String {
        guard !raw.isEmpty else { throw .missing(field) }
        // One pass over the bytes as a buffer (every subscribe checks a token or two): hex digits, and whether any
        // is uppercase.
        let scan = raw.utf8.withContiguousStorageIfAvailable(Self.scan) ?? Self.scan(raw.utf8)
        guard scan.hex else {
            throw .invalid(field, "\(field) must be hexadecimal")
        }
        guard raw.utf8.count % 2 == 0 else { throw .invalid(field, "\(field) must have an even number of hex digits") }
        guard hexLengths.contains(raw.utf8.count) else {
            throw .invalid(field, "\(field) must be \(hexLengths.lowerBound)–\(hexLengths.upperBound) hex digits")
        }
        // Tokens nearly always arrive in lowercase already: no new string for them.
        return scan.uppercase ? raw.lowercased() : raw
    }

    private static func scan(_ bytes: some Sequence<UInt8>) -> (hex: Bool, uppercase: Bool) {
        var uppercase = false
        for byte in bytes {
            guard byte.isHexDigit else { return (false, false) }
            if byte >= 0x41, byte <= 0x46 { uppercase = true }
        }
        return (true, uppercase)
    }
}
