/// Strict RFC 8259 parsing into `JSONValue` and compact serialisation, without Foundation.
///
/// `JSONDecoder` through `JSONValue`'s `Decodable` conformance tries each case in turn and throws on every miss;
/// on the ingest path that was the largest cost of a request after the kernel's. The same technique as the APNs
/// simulator's payload parser.
extension JSONValue {
    /// Deepest nesting `init(parsing:)` accepts; deeper documents are refused rather than recursed into.
    public static let maximumParsingDepth = 64

    /// 2^53: a `Double` holds every integer up to it exactly, and integers up to it are written out whole.
    public static let largestExactInteger: Int64 = 1 << 53

    /// What to tell a sender whose JSON was refused, as a larger integer may be why.
    public static let inexactIntegerHint = "an integer beyond ±2^53 counts as invalid: send such ids as strings"

    /// Parses exactly one JSON value (surrounding whitespace allowed); nil when `bytes` are not valid JSON (UTF-8
    /// included), nest deeper than `maximumParsingDepth`, hold a number no `Double` can represent, or name a member
    /// of an object twice (RFC 8259 leaves the meaning open, and readers differ: `JSONDecoder` keeps the first, a
    /// dictionary the last, so a body could be checked as one thing and used as another).
    ///
    /// `exactIntegers`: also nil for an integer written out whole beyond ±2^53 (a 64-bit id), which a `Double`
    /// would pass on changed; false for documents read but never passed on (a third party's JWT claims).
    public init?(parsing bytes: [UInt8], exactIntegers: Bool = true) {
        let parsed: JSONValue? = bytes.withUnsafeBufferPointer { buffer in
            var parser = JSONParser(bytes: buffer, exactIntegers: exactIntegers)
            guard let value = parser.value(depth: 0) else { return nil }
            parser.skipWhitespace()
            return parser.index == buffer.count ? value : nil
        }
        guard let parsed else { return nil }
        self = parsed
    }

    /// Compact JSON text with object keys sorted (deterministic, so sizes and hashes are stable); integral
    /// numbers up to ±2^53 are written as integers.
    public func encoded() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(256)
        serialize(into: &out)
        return out
    }

    /// Appends the compact JSON text of this value to `out`.
    public func serialize(into out: inout [UInt8]) {
        switch self {
        case .null: out += "null".utf8
        case .bool(let flag): out += (flag ? "true" : "false").utf8
        case .number(let number):
            // Integral numbers stay integers on the wire (`1`, not `1.0`), as in `encode(to:)`.
            if number == number.rounded(), abs(number) <= Double(Self.largestExactInteger) {
                out += String(Int64(number)).utf8
            } else {
                out += "\(number)".utf8
            }
        case .string(let text): Self.appendQuoted(text, to: &out)
        case .array(let items):
            out.append(UInt8(ascii: "["))
            for (index, item) in items.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                item.serialize(into: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let fields):
            out.append(UInt8(ascii: "{"))
            for (index, key) in fields.keys.sorted().enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                Self.appendQuoted(key, to: &out)
                out.append(UInt8(ascii: ":"))
                fields[key]!.serialize(into: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    /// A JSON string literal: quotes, backslashes and control characters escaped, everything else as UTF-8.
    ///
    /// Text with nothing to escape (ids, tokens, channels, times: nearly every string Herald writes) is copied in
    /// one append rather than byte by byte.
    public static func appendQuoted(_ text: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        // Native strings (all of Herald's) are scanned and copied as one buffer, not byte by byte through the
        // UTF-8 view's iterator (which also handles bridged strings).
        let plain = text.utf8.withContiguousStorageIfAvailable { bytes -> Bool in
            guard !bytes.contains(where: needsEscape) else { return false }
            out.append(contentsOf: bytes)
            return true
        } ?? false
        if plain {
            out.append(UInt8(ascii: "\""))
            return
        }
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""): out += #"\""#.utf8
            case UInt8(ascii: "\\"): out += #"\\"#.utf8
            case 0x0A: out += #"\n"#.utf8
            case 0x0D: out += #"\r"#.utf8
            case 0x09: out += #"\t"#.utf8
            case 0..<0x20:
                out += #"\u00"#.utf8
                out.append(hexDigits[Int(byte >> 4)])
                out.append(hexDigits[Int(byte & 0xF)])
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }

    @inline(__always)
    private static func needsEscape(_ byte: UInt8) -> Bool {
        byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\")
    }

    private static let hexDigits = Array("0123456789abcdef".utf8)
}

/// A recursive-descent parser over a byte buffer; every failure returns nil.
private struct JSONParser {
    let bytes: UnsafeBufferPointer<UInt8>
    let exactIntegers: Bool
    var index = 0

    init(bytes: UnsafeBufferPointer<UInt8>, exactIntegers: Bool) { (self.bytes, self.exactIntegers) = (bytes, exactIntegers) }

    mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    mutating func value(depth: Int) -> JSONValue? {
        guard depth < JSONValue.maximumParsingDepth else { return nil }
        skipWhitespace()
        guard index < bytes.count else { return nil }
        switch bytes[index] {
        case UInt8(ascii: "{"): return object(depth: depth)
        case UInt8(ascii: "["): return array(depth: depth)
        case UInt8(ascii: "\""): return string().map { .string($0) }
        case UInt8(ascii: "t"): return literal("true", .bool(true))
        case UInt8(ascii: "f"): return literal("false", .bool(false))
        case UInt8(ascii: "n"): return literal("null", .null)
        default: return number()
        }
    }

    private mutating func literal(_ word: StaticString, _ value: JSONValue) -> JSONValue? {
        let count = word.utf8CodeUnitCount
        guard index + count <= bytes.count else { return nil }
        for offset in 0..<count where bytes[index + offset] != word.utf8Start[offset] { return nil }
        index += count
        return value
    }

    private mutating func object(depth: Int) -> JSONValue? {
        index += 1
        // Room for a typical request body's members up front, rather than growing (and rehashing) member by member.
        var fields = [String: JSONValue](minimumCapacity: 8)
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            return .object(fields)
        }
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\""), let key = string() else { return nil }
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { return nil }
            index += 1
            guard let item = value(depth: depth + 1) else { return nil }
            guard fields.updateValue(item, forKey: key) == nil else { return nil }
            skipWhitespace()
            guard index < bytes.count else { return nil }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            guard bytes[index] == UInt8(ascii: "}") else { return nil }
            index += 1
            return .object(fields)
        }
    }

    private mutating func array(depth: Int) -> JSONValue? {
        index += 1
        var items: [JSONValue] = []
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
            index += 1
            return .array(items)
        }
        while true {
            guard let item = value(depth: depth + 1) else { return nil }
            items.append(item)
            skipWhitespace()
            guard index < bytes.count else { return nil }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            guard bytes[index] == UInt8(ascii: "]") else { return nil }
            index += 1
            return .array(items)
        }
    }

    private mutating func string() -> String? {
        index += 1
        let start = index
        // Fast path: no escapes, so the text is the bytes between the quotes. `high` collects the bytes' top bits:
        // pure ASCII (ids, tokens, channels, nearly every string a request carries) needs no UTF-8 validation.
        var high: UInt8 = 0
        while index < bytes.count, bytes[index] != UInt8(ascii: "\""), bytes[index] != UInt8(ascii: "\\") {
            guard bytes[index] >= 0x20 else { return nil }
            high |= bytes[index]
            index += 1
        }
        guard index < bytes.count else { return nil }
        if bytes[index] == UInt8(ascii: "\"") {
            defer { index += 1 }
            let text = UnsafeBufferPointer(rebasing: bytes[start..<index])
            guard high < 0x80 else { return String(validating: text, as: UTF8.self) }
            return String(unsafeUninitializedCapacity: text.count) { out in
                _ = out.initialize(fromContentsOf: text)
                return text.count
            }
        }
        var text = Array(bytes[start..<index])
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                index += 1
                return String(validating: text, as: UTF8.self)
            }
            guard byte >= 0x20 else { return nil }
            if byte != UInt8(ascii: "\\") {
                text.append(byte)
                index += 1
                continue
            }
            index += 1
            guard index < bytes.count else { return nil }
            let escape = bytes[index]
            index += 1
            switch escape {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): text.append(escape)
            case UInt8(ascii: "b"): text.append(0x08)
            case UInt8(ascii: "f"): text.append(0x0C)
            case UInt8(ascii: "n"): text.append(0x0A)
            case UInt8(ascii: "r"): text.append(0x0D)
            case UInt8(ascii: "t"): text.append(0x09)
            case UInt8(ascii: "u"):
                guard var code = hex4() else { return nil }
                if (0xD800..<0xDC00).contains(code) {
                    guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"),
                          bytes[index + 1] == UInt8(ascii: "u") else { return nil }
                    index += 2
                    guard let low = hex4(), (0xDC00..<0xE000).contains(low) else { return nil }
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                }
                // A lone low surrogate is not a scalar: refused here.
                guard let scalar = Unicode.Scalar(code) else { return nil }
                text.append(contentsOf: String(scalar).utf8)
            default: return nil
            }
        }
        return nil
    }

    private mutating func hex4() -> UInt32? {
        guard index + 4 <= bytes.count else { return nil }
        var code: UInt32 = 0
        for _ in 0..<4 {
            let c = bytes[index]
            let digit: UInt32
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(c - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(c - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(c - UInt8(ascii: "A") + 10)
            default: return nil
            }
            code = code << 4 | digit
            index += 1
        }
        return code
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`. With `exactIntegers`, an integer written out whole beyond
    /// ±2^53 (such as a 64-bit id) is refused rather than passed on changed or in exponent form.
    private mutating func number() -> JSONValue? {
        let start = index
        if index < bytes.count, bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count else { return nil }
        var integerDigits = 1
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            integerDigits = digits()
            guard integerDigits > 0 else { return nil }
        }
        let wholeInteger = index == bytes.count || (bytes[index] != UInt8(ascii: ".") && bytes[index] != UInt8(ascii: "e")
                                                    && bytes[index] != UInt8(ascii: "E"))
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard digits() > 0 else { return nil }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard digits() > 0 else { return nil }
        }
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
        guard let number = Double(text), number.isFinite else { return nil }
        if exactIntegers, wholeInteger, integerDigits > 15 {
            guard let integer = Int64(text), integer.magnitude <= JSONValue.largestExactInteger.magnitude else { return nil }
        }
        return .number(number)
    }

    private mutating func digits() -> Int {
        let from = index
        while index < bytes.count, bytes[index] >= 0x30, bytes[index] <= 0x39 { index += 1 }
        return index - from
    }
}
