import HeraldRuntime

/// `POST …/activities/register`, checked. The push token is a credential: never echoed or logged.
public struct ActivityRegistrationInput: Sendable, Equatable {
    public var pushToken: String
    public var postIDHash: String
    public var environment: APNsEnvironment
    public var bundleID: String

    /// `app` decides which bundle ids are allowed: its own and its extensions'.
    public init(_ body: JSONValue, app: App) throws(ValidationError) {
        let fields = try FieldReader(body, allowed: ["push_token", "post_id_hash", "apns_environment", "bundle_id"])
        pushToken = try DeviceToken.normalized(try fields.requiredString("push_token"), field: "push_token")
        postIDHash = try fields.requiredString("post_id_hash")
        try PostIDHash.validate(postIDHash, field: "post_id_hash")
        environment = try fields.enumeration("apns_environment", APNsEnvironment.self) ?? .production
        bundleID = try fields.requiredString("bundle_id")
        guard BundleID.isWellFormed(bundleID) else {
            throw .invalid("bundle_id", "bundle_id must be a bundle identifier (letters, digits, '-' and '.')")
        }
        guard app.owns(bundleID: bundleID) else {
            throw .invalid("bundle_id", "bundle_id must be \(app.apns.bundleId) or start with \(app.apns.bundleId).")
        }
    }
}

/// A post's id hash: a SHA-256 prefix in lowercase hex, 8–64 characters.
public enum PostIDHash {
    public static func validate(_ value: String, field: String) throws(ValidationError) {
        guard (8...64).contains(value.utf8.count),
              value.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }) else {
            throw .invalid(field, "\(field) must be 8–64 lowercase hex characters")
        }
    }
}

public enum BundleID {
    public static func isWellFormed(_ value: String) -> Bool {
        !value.isEmpty && value.utf8.count <= 155 && !value.hasPrefix(".") && !value.hasSuffix(".")
            && !value.contains("..")
            && value.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == ".") }
    }
}
