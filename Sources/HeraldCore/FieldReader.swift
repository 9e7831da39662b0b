import HeraldAPNsCore
import HeraldRuntime

/// Reads the fields of a JSON request body one by one, so each mistake is reported with its field name.
public struct FieldReader {
    public let object: [String: JSONValue]
    let prefix: String

    /// Fails unless `body` is a JSON object with only the `allowed` fields (any fields when `allowed` is nil:
    /// records a later version may add to).
    public init(_ body: JSONValue, allowed: Set<String>? = nil, prefix: String = "") throws(ValidationError) {
        guard case .object(let object) = body else {
            throw ValidationError(code: "invalid_body", message: prefix.isEmpty ? "the body must be a JSON object"
                                  : "\(prefix.dropLast()) must be an object", field: prefix.isEmpty ? nil : String(prefix.dropLast()))
        }
        // The first unknown field in sorted order, without sorting (or copying) the keys of every valid body.
        if let allowed, let unknown = object.keys.lazy.filter({ !allowed.contains($0) }).min() {
            throw ValidationError(code: "unknown_field", message: "\(prefix)\(unknown) is not a known field", field: prefix + unknown)
        }
        self.object = object
        self.prefix = prefix
    }

    public func name(_ field: String) -> String { prefix + field }

    /// A present, non-null value.
    public func value(_ field: String) -> JSONValue? {
        guard let value = object[field], value != .null else { return nil }
        return value
    }

    public func string(_ field: String) throws(ValidationError) -> String? {
        guard let value = value(field) else { return nil }
        guard case .string(let text) = value else { throw .invalid(name(field), "\(name(field)) must be a string") }
        return text
    }

    public func requiredString(_ field: String) throws(ValidationError) -> String {
        guard let text = try string(field), !text.isEmpty else { throw .missing(name(field)) }
        return text
    }

    public func integer(_ field: String, in range: ClosedRange<Int64>) throws(ValidationError) -> Int64? {
        guard let value = value(field) else { return nil }
        guard case .number(let number) = value, number == number.rounded(), number >= Double(range.lowerBound),
              number <= Double(range.upperBound) else {
            throw .invalid(name(field), "\(name(field)) must be a whole number from \(range.lowerBound) to \(range.upperBound)")
        }
        return Int64(number)
    }

    public func number(_ field: String) throws(ValidationError) -> Double? {
        guard let value = value(field) else { return nil }
        guard case .number(let number) = value else { throw .invalid(name(field), "\(name(field)) must be a number") }
        return number
    }

    public func bool(_ field: String) throws(ValidationError) -> Bool? {
        guard let value = value(field) else { return nil }
        guard case .bool(let flag) = value else { throw .invalid(name(field), "\(name(field)) must be true or false") }
        return flag
    }

    /// A JSON object, kept whole (payloads, content state, metadata).
    public func object(_ field: String) throws(ValidationError) -> JSONValue? {
        guard let value = value(field) else { return nil }
        guard case .object = value else { throw .invalid(name(field), "\(name(field)) must be a JSON object") }
        return value
    }

    public func requiredObject(_ field: String) throws(ValidationError) -> JSONValue {
        guard let value = try object(field) else { throw .missing(name(field)) }
        return value
    }

    public func enumeration<E: RawRepresentable>(_ field: String, _ type: E.Type) throws(ValidationError) -> E?
    where E.RawValue == String, E: CaseIterable {
        guard let text = try string(field) else { return nil }
        guard let value = E(rawValue: text) else {
            let choices = E.allCases.map { "\"\($0.rawValue)\"" }.joined(separator: ", ")
            throw .invalid(name(field), "\(name(field)) must be one of \(choices)")
        }
        return value
    }

    /// An iOS 18 channel's storage policy by its name, `noStorage` or `mostRecentMessage`.
    public func storagePolicy(_ field: String) throws(ValidationError) -> APNsStoragePolicy? {
        guard let text = try string(field) else { return nil }
        guard let policy = APNsStoragePolicy(name: text) else {
            throw .invalid(name(field), "\(name(field)) must be noStorage or mostRecentMessage")
        }
        return policy
    }
}
