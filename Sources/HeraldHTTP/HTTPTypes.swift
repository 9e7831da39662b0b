import HeraldRuntime
/// An HTTP request method. Any token a client sends is representable; the common ones are constants.
public struct HTTPMethod: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public var rawValue: String

    public init(rawValue: String) { self.rawValue = rawValue }

    public static let get = HTTPMethod(rawValue: "GET")
    public static let head = HTTPMethod(rawValue: "HEAD")
    public static let post = HTTPMethod(rawValue: "POST")
    public static let put = HTTPMethod(rawValue: "PUT")
    public static let patch = HTTPMethod(rawValue: "PATCH")
    public static let delete = HTTPMethod(rawValue: "DELETE")
    public static let options = HTTPMethod(rawValue: "OPTIONS")

    public var description: String { rawValue }

    /// The method as a metric label: client-chosen tokens collapse to `other` so label sets stay bounded.
    var metricLabel: String {
        switch self {
        case .get, .head, .post, .put, .patch, .delete, .options: rawValue
        default: "other"
        }
    }
}

/// Header fields in order, looked up case-insensitively. Repeated names are kept; `subscript` returns the first.
public struct HTTPHeaders: Sendable, Sequence, ExpressibleByDictionaryLiteral, CustomStringConvertible {
    public typealias Element = (name: String, value: String)

    private var fields: [Element]

    public init() { fields = [] }

    /// No fields yet, with room for `capacity` of them.
    init(capacity: Int) {
        fields = []
        fields.reserveCapacity(capacity)
    }

    public init(dictionaryLiteral elements: (String, String)...) {
        fields = elements.map { (name: $0.0, value: $0.1) }
    }

    /// The first value of `name` (any case); setting replaces every field of that name, `nil` removes them.
    public subscript(name: String) -> String? {
        get { fields.first { Self.sameName($0.name, name) }?.value }
        set {
            fields.removeAll { Self.sameName($0.name, name) }
            if let newValue { fields.append((name: name, value: newValue)) }
        }
    }

    /// Every value of `name`, in the order they were added.
    public func values(_ name: String) -> [String] {
        fields.filter { Self.sameName($0.name, name) }.map(\.value)
    }

    /// Adds a field, keeping any existing field of the same name.
    public mutating func add(_ name: String, _ value: String) { fields.append((name: name, value: value)) }

    public func contains(_ name: String) -> Bool { fields.contains { Self.sameName($0.name, name) } }

    public var count: Int { fields.count }
    public var isEmpty: Bool { fields.isEmpty }

    public func makeIterator() -> IndexingIterator<[Element]> { fields.makeIterator() }

    public var description: String { fields.map { "\($0.name): \($0.value)" }.joined(separator: ", ") }

    /// ASCII case-insensitive comparison without allocating (header names are ASCII tokens).
    /// Names of different lengths (most pairs a lookup meets) are told apart without reading a byte.
    static func sameName(_ a: String, _ b: String) -> Bool {
        guard a.utf8.count == b.utf8.count else { return false }
        var left = a.utf8.makeIterator()
        var right = b.utf8.makeIterator()
        while true {
            switch (left.next(), right.next()) {
            case (nil, nil): return true
            case let (x?, y?):
                if x != y && lowercased(x) != lowercased(y) { return false }
            default: return false
            }
        }
    }

    private static func lowercased(_ byte: UInt8) -> UInt8 {
        (byte >= 0x41 && byte <= 0x5A) ? byte + 0x20 : byte
    }
}
