import HeraldAPNsCore
import HeraldRuntime

/// The body of `POST …/activities/register` as sent, reduced to its four string slots before any rule is checked.
///
/// Read from the body parsed by `JSONValue(parsing:)`, as every endpoint reads its body (so a member named twice
/// is refused alike everywhere). Building it never fails on content: `ActivityRegistrationInput` reports every
/// mistake with its field name.
public struct ActivityRegistrationBody: Sendable {
    /// A field as sent: absent or `null`, a string, or a value of another type.
    enum Field: Sendable, Equatable {
        case absent
        case string(String)
        case other
    }

    static let names = ["push_token", "post_id_hash", "apns_environment", "bundle_id"]

    var isObject = true
    /// The first (in sorted order) field that is not one of `names`.
    var unknownField: String?
    var fields: [Field] = Array(repeating: .absent, count: names.count)

    /// The slots of a parsed body.
    public init(_ json: JSONValue) {
        guard case .object(let object) = json else {
            isObject = false
            return
        }
        unknownField = object.keys.lazy.filter { !Self.names.contains($0) }.min()
        for (index, name) in Self.names.enumerated() {
            switch object[name] {
            case nil, .null?: fields[index] = .absent
            case .string(let text)?: fields[index] = .string(text)
            case _?: fields[index] = .other
            }
        }
    }

    func string(_ name: String) throws(ValidationError) -> String? {
        switch fields[Self.names.firstIndex(of: name)!] {
        case .absent: return nil
        case .string(let text): return text
        case .other: throw .invalid(name, "\(name) must be a string")
        }
    }

    func requiredString(_ name: String) throws(ValidationError) -> String {
        guard let text = try string(name), !text.isEmpty else { throw .missing(name) }
        return text
    }
}

/// `POST …/activities/register`, checked. The push token is a credential: never echoed or logged.
public struct ActivityRegistrationInput: Sendable, Equatable {
    public var pushToken: String
    public var postIDHash: String
    public var environment: APNsEnvironment
    public var bundleID: String

    /// `app` decides which bundle ids are allowed: its own and its extensions'.
    public init(_ body: ActivityRegistrationBody, app: App) throws(ValidationError) {
        guard body.isObject else { throw ValidationError(code: "invalid_body", message: "the body must be a JSON object") }
        if let unknown = body.unknownField {
            throw ValidationError(code: "unknown_field", message: "\(unknown) is not a known field", field: unknown)
        }
        pushToken = try DeviceToken.normalized(try body.requiredString("push_token"), field: "push_token")
        postIDHash = try body.requiredString("post_id_hash")
        try PostIDHash.validate(postIDHash, field: "post_id_hash")
        if let environment = try body.string("apns_environment") {
            guard let parsed = APNsEnvironment(rawValue: environment) else {
                throw .invalid("apns_environment", "apns_environment must be one of \"production\", \"sandbox\"")
            }
            self.environment = parsed
        } else {
            environment = .production
        }
        bundleID = try body.requiredString("bundle_id")
        guard BundleID.isWellFormed(bundleID) else {
            throw .invalid("bundle_id", "bundle_id must be a bundle identifier (letters, digits, '-' and '.')")
        }
        guard app.owns(bundleID: bundleID) else {
            throw .invalid("bundle_id", "bundle_id must be \(app.apns.bundleId) or start with \(app.apns.bundleId).")
        }
    }

    /// The same from an already parsed JSON value.
    public init(_ json: JSONValue, app: App) throws(ValidationError) {
        try self.init(ActivityRegistrationBody(json), app: app)
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
    /// ASCII letters, digits, '-' and '.', at most 155 bytes, no empty dot-separated part.
    public static func isWellFormed(_ value: String) -> Bool {
        var previous: UInt8 = UInt8(ascii: ".")
        var count = 0
        for byte in value.utf8 {
            count += 1
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"):
                break
            case UInt8(ascii: "."):
                if previous == UInt8(ascii: ".") { return false }
            default:
                return false
            }
            previous = byte
        }
        return (1...155).contains(count) && previous != UInt8(ascii: ".")
    }
}
