/// Decodes a `Transfer-Encoding: chunked` body incrementally, as its bytes arrive. Pure: it consumes from the
/// buffers it is given and keeps only its position in the chunk grammar.
public struct ChunkedBodyDecoder: Sendable {
    /// Body bytes kept at most; bytes past it are counted in `received` but dropped.
    public let limit: Int
    /// How far past `limit` a body may go (read and dropped, so a 413 leaves the connection in step) before
    /// decoding fails with 413.
    public let discardAllowance: Int
    /// Bytes of the chunk-size lines and trailer section allowed, together.
    public let framingLimit: Int
    /// Body bytes seen so far, kept or dropped.
    public private(set) var received = 0
    private var framingBytes = 0
    private var state = State.size(digits: 0, value: 0)

    private enum State: Sendable {
        case size(digits: Int, value: Int)
        /// Skipping a chunk extension up to the line's end.
        case sizeExtension(value: Int)
        case sizeLF(value: Int)
        case data(remaining: Int)
        case dataCR
        case dataLF
        /// In the trailer section, `length` bytes into the current field line's name (0: at a line's start).
        case trailerName(length: Int)
        /// In a trailer field's value.
        case trailerValue
        /// After the CR of a trailer line; `empty` when the line was the blank one that ends the section.
        case trailerLF(empty: Bool)
        case done
    }

    /// What `decode` reached.
    public enum Progress: Sendable, Equatable {
        case needMore
        /// The last chunk and the trailer section are in.
        case done
        case failed(HTTPParseFailure)
    }

    public init(limit: Int, discardAllowance: Int, framingLimit: Int) {
        self.limit = limit
        self.discardAllowance = discardAllowance
        self.framingLimit = framingLimit
    }

    /// True once more than `limit` body bytes have been seen: the request is answered 413.
    public var overLimit: Bool { received > limit }

    /// Decodes from `input`, appending body bytes to `body` while the total stays within `limit`. Returns how many
    /// input bytes were consumed (all of them unless the body ended or failed within `input`).
    public mutating func decode(_ input: UnsafeRawBufferPointer, into body: inout [UInt8]) -> (consumed: Int, progress: Progress) {
        let bytes = input.bindMemory(to: UInt8.self)
        var index = 0
        while index < bytes.count {
            let byte = bytes[index]
            switch state {
            case .data(let remaining):
                let take = min(remaining, bytes.count - index)
                let keep = max(0, min(take, limit - received))
                if keep > 0 { body.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[index..<(index + keep)])) }
                received += take
                index += take
                state = remaining == take ? .dataCR : .data(remaining: remaining - take)
                continue
            case .size(let digits, let value):
                if let digit = Self.hexValue(byte) {
                    let size = value * 16 + Int(digit)
                    // Refused before it can overflow: no chunk may take the body past what would be dropped.
                    guard digits < 15, received + size <= limit + discardAllowance else {
                        return (index, fail(Self.tooLarge(limit)))
                    }
                    state = .size(digits: digits + 1, value: size)
                } else if digits > 0, byte == HTTPRequestParser.cr {
                    state = .sizeLF(value: value)
                } else if digits > 0, byte == UInt8(ascii: ";") || byte == HTTPRequestParser.space
                            || byte == HTTPRequestParser.tab {
                    state = .sizeExtension(value: value)
                } else {
                    return (index, fail(.bad("malformed chunk size")))
                }
            case .sizeExtension(let value):
                if byte == HTTPRequestParser.cr { state = .sizeLF(value: value) }
                else if byte < 0x20 && byte != HTTPRequestParser.tab || byte == 0x7F {
                    return (index, fail(.bad("malformed chunk extension")))
                }
            case .sizeLF(let value):
                guard byte == HTTPRequestParser.lf else { return (index, fail(.bad("malformed chunk size line"))) }
                state = value == 0 ? .trailerName(length: 0) : .data(remaining: value)
            case .dataCR:
                guard byte == HTTPRequestParser.cr else { return (index, fail(.bad("chunk longer than its size"))) }
                state = .dataLF
            case .dataLF:
                guard byte == HTTPRequestParser.lf else { return (index, fail(.bad("chunk longer than its size"))) }
                state = .size(digits: 0, value: 0)
            // Trailer fields are read as field lines (RFC 9112 §7.1.2) and dropped: `name: value`, the name a
            // token, the value free of control characters but HTAB. Anything else fails the request.
            case .trailerName(let length):
                if byte == HTTPRequestParser.cr, length == 0 {
                    state = .trailerLF(empty: true)
                } else if byte == UInt8(ascii: ":"), length > 0 {
                    state = .trailerValue
                } else if HTTPRequestParser.isToken(byte) {
                    state = .trailerName(length: length + 1)
                } else {
                    return (index, fail(.bad("malformed trailer field")))
                }
            case .trailerValue:
                if byte == HTTPRequestParser.cr { state = .trailerLF(empty: false) }
                else if byte < 0x20 && byte != HTTPRequestParser.tab || byte == 0x7F {
                    return (index, fail(.bad("malformed trailer field")))
                }
            case .trailerLF(let empty):
                guard byte == HTTPRequestParser.lf else { return (index, fail(.bad("malformed trailer section"))) }
                if empty {
                    state = .done
                    return (index + 1, .done)
                }
                state = .trailerName(length: 0)
            case .done:
                return (index, .done)
            }
            framingBytes += 1
            index += 1
            if framingBytes > framingLimit {
                return (index, fail(HTTPParseFailure(status: 413, code: "body_too_large",
                                                     message: "the chunked body's size lines and trailers exceed \(framingLimit) bytes")))
            }
        }
        if case .done = state { return (index, .done) }
        return (index, .needMore)
    }

    private mutating func fail(_ failure: HTTPParseFailure) -> Progress {
        state = .done
        return .failed(failure)
    }

    static func tooLarge(_ limit: Int) -> HTTPParseFailure {
        HTTPParseFailure(status: 413, code: "body_too_large", message: "the request body is larger than \(limit) bytes")
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case 0x30...0x39: byte - 0x30
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

extension Substring {
    var trimmingSpaces: Substring {
        var text = self
        while let first = text.first, first == " " || first == "\t" { text.removeFirst() }
        while let last = text.last, last == " " || last == "\t" { text.removeLast() }
        return text
    }
}

extension String {
    var trimmingSpaces: Substring { self[...].trimmingSpaces }
}
