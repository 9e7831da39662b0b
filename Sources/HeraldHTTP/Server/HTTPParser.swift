/// Why a request cannot be served: the status and JSON error it is answered with, after which the connection
/// closes (the byte stream can no longer be trusted to be in step).
public struct HTTPParseFailure: Error, Sendable, Equatable {
    public var status: Int
    public var code: String
    public var message: String

    public init(status: Int, code: String, message: String) {
        self.status = status
        self.code = code
        self.message = message
    }

    /// The error response this failure is answered with.
    public var error: HTTPError { HTTPError(status: status, code: code, message: message) }

    static func bad(_ message: String) -> HTTPParseFailure {
        HTTPParseFailure(status: 400, code: "bad_request", message: message)
    }
}

/// How the body of a request is delimited.
public enum HTTPBodyFraming: Sendable, Equatable {
    /// No body (no Content-Length, no Transfer-Encoding).
    case none
    /// `Content-Length` bytes.
    case length(Int)
    /// `Transfer-Encoding: chunked`.
    case chunked
}

/// A request line and header block as read from the wire.
public struct HTTPRequestHead: Sendable {
    /// The method token as sent (case-sensitive).
    public var method: String
    /// The target up to `?`, still percent-encoded (the router decodes segment by segment).
    public var path: String
    /// What follows the first `?`, still encoded; nil without one.
    public var query: String?
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    public var minorVersion: Int
    public var headers: HTTPHeaders
    /// The body's framing, or why it is refused (both Content-Length and Transfer-Encoding, an invalid length, a
    /// transfer coding other than chunked). A refusal is answered once the request is routed, so it is logged and
    /// counted under its route.
    public var framing: Result<HTTPBodyFraming, HTTPParseFailure>
    /// HTTP/1.1 without `Connection: close`, or HTTP/1.0 with `Connection: keep-alive`.
    public var keepAlive: Bool
    /// `Expect: 100-continue` on HTTP/1.1.
    public var expectsContinue: Bool
}

/// The HTTP/1.1 request parser: pure functions over bytes (fuzzed by `Fuzz/…/herald-fuzz-http`).
public enum HTTPRequestParser {
    /// What `parseHead` found.
    public enum Head: Sendable {
        /// No complete header block yet, and nothing wrong so far.
        case incomplete
        /// A header block of `length` bytes (including leading blank lines and the final empty line).
        case complete(HTTPRequestHead, length: Int)
        /// Answer with the failure and close.
        case failed(HTTPParseFailure)
    }

    static let headerBlockTooLarge = HTTPParseFailure(
        status: 431, code: "headers_too_large", message: "the request line and headers are too large")

    /// How far an incomplete head has been read: the next parse of the same head, with more bytes behind it,
    /// goes on from there, so a head arriving a byte at a time costs its length once, not its length squared.
    /// Offsets are from the start of the buffer given to `parseHead`; a new head starts with a new scan.
    public struct HeadScan: Sendable {
        /// Where the request line starts, past blank lines.
        var start = 0
        /// Where the search for the block's empty line goes on.
        var searched = 0
        /// How far the request line was checked by `rejectEarly`, whether that passed the method, and whether it
        /// reached the line's end (then nothing more is checked early).
        var lineChecked = 0
        var pastMethod = false
        var lineEnded = false

        public init() {}
    }

    /// Parses the request line and headers at the start of `buffer`. The block, with its final empty line, must
    /// fit in `limit` bytes (else 431). Never reads past `buffer`; a complete head's length is at most its count.
    public static func parseHead(_ buffer: UnsafeRawBufferPointer, limit: Int) -> Head {
        var scan = HeadScan()
        return parseHead(buffer, limit: limit, resuming: &scan)
    }

    /// The same, going on from `scan`: what an earlier call found of this head when `buffer` held fewer bytes.
    public static func parseHead(_ buffer: UnsafeRawBufferPointer, limit: Int, resuming scan: inout HeadScan) -> Head {
        let bytes = buffer.bindMemory(to: UInt8.self)
        // RFC 9112 §2.2: blank lines before a request line (left over after a body) are ignored.
        var start = scan.start
        while start + 1 < bytes.count, bytes[start] == cr, bytes[start + 1] == lf { start += 2 }
        scan.start = start
        let window = min(bytes.count, limit)
        var end = -1
        // Every position before `index` has been ruled out, by bytes that do not change as more arrive.
        var index = max(start, scan.searched)
        while index + 3 < window {
            if bytes[index + 3] != lf { index += bytes[index + 3] == cr ? 1 : 4; continue }
            if bytes[index] == cr, bytes[index + 1] == lf, bytes[index + 2] == cr { end = index; break }
            index += 1
        }
        guard end >= 0 else {
            scan.searched = index
            if let failure = rejectEarly(bytes, scan: &scan) { return .failed(failure) }
            return bytes.count >= limit ? .failed(headerBlockTooLarge) : .incomplete
        }
        switch parseBlock(bytes, from: start, to: end) {
        case .success(let head): return .complete(head, length: end + 4)
        case .failure(let failure): return .failed(failure)
        }
    }

    /// A request line that is already wrong before the header block ends (binary junk, a TLS handshake) is
    /// refused at once rather than after the header limit or the read timeout. Checks only the bytes `scan` has
    /// not checked yet.
    private static func rejectEarly(_ bytes: UnsafeBufferPointer<UInt8>, scan: inout HeadScan) -> HTTPParseFailure? {
        guard !scan.lineEnded else { return nil }
        var index = max(scan.lineChecked, scan.start)
        if !scan.pastMethod {
            while index < bytes.count, bytes[index] != space {
                guard isToken(bytes[index]) else {
                    guard bytes[index] == cr else { return .bad("malformed request line") }
                    // A CR ending a method: the full parse judges the line.
                    if index > scan.start { scan.lineEnded = true; return nil }
                    // The buffer's last byte: the first half of a blank line whose LF has not arrived.
                    guard index + 1 == bytes.count else { return .bad("malformed request line") }
                    scan.lineChecked = index
                    return nil
                }
                index += 1
            }
            scan.lineChecked = index
            guard index < bytes.count else { return nil }
            scan.pastMethod = true
        }
        while index < bytes.count, bytes[index] != cr {
            guard bytes[index] >= 0x20, bytes[index] < 0x7F else { return .bad("malformed request line") }
            index += 1
        }
        scan.lineEnded = index < bytes.count
        scan.lineChecked = index
        return nil
    }

    private static func parseBlock(_ bytes: UnsafeBufferPointer<UInt8>, from start: Int,
                                   to end: Int) -> Result<HTTPRequestHead, HTTPParseFailure> {
        // Request line: method SP target SP version. The target runs from the first space to the last, so a target
        // with spaces is a 404 rather than a broken connection.
        var lineEnd = start
        while bytes[lineEnd] != cr || bytes[lineEnd + 1] != lf { lineEnd += 1 }
        guard let firstSpace = (start..<lineEnd).first(where: { bytes[$0] == space }),
              let lastSpace = (start..<lineEnd).last(where: { bytes[$0] == space }), lastSpace > firstSpace,
              firstSpace > start, (start..<firstSpace).allSatisfy({ isToken(bytes[$0]) }) else {
            return .failure(.bad("malformed request line"))
        }
        let version = UnsafeBufferPointer(rebasing: bytes[(lastSpace + 1)..<lineEnd])
        guard version.count == 8, version.starts(with: "HTTP/".utf8), isDigit(version[5]), version[6] == dot,
              isDigit(version[7]) else {
            return .failure(.bad("malformed HTTP version"))
        }
        guard version[5] == UInt8(ascii: "1") else {
            return .failure(HTTPParseFailure(status: 505, code: "http_version_not_supported",
                                             message: "only HTTP/1.1 and HTTP/1.0 are served"))
        }
        // RFC 9110 §2.5: a later 1.x minor version is answered as 1.1.
        let minor = version[7] == UInt8(ascii: "0") ? 0 : 1
        let target = (firstSpace + 1)..<lastSpace
        guard !target.isEmpty, bytes[target.lowerBound] == slash,
              target.allSatisfy({ bytes[$0] >= 0x20 && bytes[$0] < 0x7F }) else {
            return .failure(.bad("the request target must be a path (origin-form)"))
        }
        let question = target.first { bytes[$0] == UInt8(ascii: "?") }
        let path = string(bytes, target.lowerBound..<(question ?? target.upperBound))
        let query = question.map { string(bytes, ($0 + 1)..<target.upperBound) }
        let method = string(bytes, start..<firstSpace)

        var headers = HTTPHeaders(capacity: 8)  // most clients send fewer: no regrowing the array field by field
        var contentLength: Int?
        var lengthInvalid = false
        var transferEncoding: String?
        var close = false
        var keepAliveToken = false
        var expectsContinue = false
        var hosts = 0
        var line = lineEnd + 2
        while line < end + 2 {
            var next = line
            while bytes[next] != cr || bytes[next + 1] != lf { next += 1 }
            guard bytes[line] != space, bytes[line] != tab else {
                return .failure(.bad("folded header lines are not accepted"))
            }
            guard let colon = (line..<next).first(where: { bytes[$0] == colon }), colon > line,
                  (line..<colon).allSatisfy({ isToken(bytes[$0]) }) else {
                return .failure(.bad("malformed header line"))
            }
            var valueStart = colon + 1
            var valueEnd = next
            while valueStart < valueEnd, bytes[valueStart] == space || bytes[valueStart] == tab { valueStart += 1 }
            while valueEnd > valueStart, bytes[valueEnd - 1] == space || bytes[valueEnd - 1] == tab { valueEnd -= 1 }
            guard (valueStart..<valueEnd).allSatisfy({ bytes[$0] >= 0x20 && bytes[$0] != 0x7F || bytes[$0] == tab })
            else { return .failure(.bad("invalid character in a header value")) }
            let nameRange = line..<colon
            let valueRange = valueStart..<valueEnd
            let value = string(bytes, valueRange)
            if matches(bytes, nameRange, "content-length") {
                if let length = decimal(bytes, valueRange), contentLength == nil || contentLength == length {
                    contentLength = length
                } else {
                    lengthInvalid = true
                }
            } else if matches(bytes, nameRange, "transfer-encoding") {
                transferEncoding = transferEncoding.map { $0 + "," + value } ?? value
            } else if matches(bytes, nameRange, "connection") {
                for token in value.split(separator: ",") {
                    let token = token.trimmingSpaces.lowercased()
                    if token == "close" { close = true } else if token == "keep-alive" { keepAliveToken = true }
                }
            } else if matches(bytes, nameRange, "expect") {
                expectsContinue = minor == 1 && value.lowercased() == "100-continue"
            } else if matches(bytes, nameRange, "host") {
                hosts += 1
            }
            headers.add(string(bytes, nameRange), value)
            line = next + 2
        }

        // RFC 9112 §3.2: exactly one Host in HTTP/1.1, at most one in 1.0. §6.1: Transfer-Encoding in an HTTP/1.0
        // request means the framing cannot be trusted.
        guard hosts == 1 || (minor == 0 && hosts == 0) else {
            return .failure(.bad(hosts == 0 ? "an HTTP/1.1 request must carry a Host header" : "more than one Host header"))
        }
        guard minor == 1 || transferEncoding == nil else {
            return .failure(.bad("Transfer-Encoding is not accepted in an HTTP/1.0 request"))
        }
        let framing: Result<HTTPBodyFraming, HTTPParseFailure>
        if transferEncoding != nil, contentLength != nil || lengthInvalid {
            // Both framings: the mark of request smuggling (RFC 9112 §6.1 says close after answering).
            framing = .failure(HTTPParseFailure(status: 400, code: "ambiguous_length",
                                                message: "Content-Length and Transfer-Encoding must not both be sent"))
        } else if let transferEncoding {
            framing = transferEncoding.trimmingSpaces.lowercased() == "chunked"
                ? .success(.chunked)
                : .failure(HTTPParseFailure(status: 501, code: "not_implemented",
                                            message: "the only transfer coding accepted is chunked"))
        } else if lengthInvalid {
            framing = .failure(HTTPParseFailure(status: 400, code: "invalid_content_length",
                                                message: "Content-Length must be one non-negative integer"))
        } else if let contentLength, contentLength > 0 {
            framing = .success(.length(contentLength))
        } else {
            framing = .success(.none)
        }
        return .success(HTTPRequestHead(
            method: method, path: path, query: query, minorVersion: minor, headers: headers, framing: framing,
            keepAlive: !close && (minor == 1 || keepAliveToken), expectsContinue: expectsContinue))
    }

    /// The query's arguments: split at `&` and the first `=`, `+` turned into a
    /// space, percent escapes left for `HTTPRequest.query(arguments:)`; a name without `=` has the value "".
    public static func arguments(ofQuery query: String) -> [(name: String, value: String)] {
        var parts = query.split(separator: "&", omittingEmptySubsequences: false)
        if parts.last?.isEmpty == true { parts.removeLast() }
        return parts.map { part in
            let plus = { (text: Substring) in
                text.contains("+") ? String(text.map { $0 == "+" ? " " : $0 }) : String(text)
            }
            guard let equals = part.firstIndex(of: "=") else { return (name: plus(part), value: "") }
            return (name: plus(part[..<equals]), value: plus(part[part.index(after: equals)...]))
        }
    }

    // MARK: Bytes

    static let cr = UInt8(ascii: "\r"), lf = UInt8(ascii: "\n"), space = UInt8(ascii: " "), tab = UInt8(ascii: "\t")
    static let colon = UInt8(ascii: ":"), slash = UInt8(ascii: "/"), dot = UInt8(ascii: ".")

    static func isDigit(_ byte: UInt8) -> Bool { byte >= 0x30 && byte <= 0x39 }

    /// RFC 9110 `tchar`.
    static func isToken(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), 0x30...0x39: true
        case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"),
             UInt8(ascii: "'"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."),
             UInt8(ascii: "^"), UInt8(ascii: "_"), UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"): true
        default: false
        }
    }

    private static func string(_ bytes: UnsafeBufferPointer<UInt8>, _ range: Range<Int>) -> String {
        String(decoding: UnsafeBufferPointer(rebasing: bytes[range]), as: UTF8.self)
    }

    /// ASCII case-insensitive comparison with a lower-case name.
    private static func matches(_ bytes: UnsafeBufferPointer<UInt8>, _ range: Range<Int>, _ lower: StaticString) -> Bool {
        guard range.count == lower.utf8CodeUnitCount else { return false }
        let expected = lower.utf8Start
        for offset in 0..<range.count {
            let byte = bytes[range.lowerBound + offset]
            let folded = byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte
            if folded != expected[offset] { return false }
        }
        return true
    }

    /// 1–18 decimal digits (no sign, no spaces): anything larger is refused before it could overflow.
    private static func decimal(_ bytes: UnsafeBufferPointer<UInt8>, _ range: Range<Int>) -> Int? {
        guard !range.isEmpty, range.count <= 18 else { return nil }
        var value = 0
        for index in range {
            guard isDigit(bytes[index]) else { return nil }
            value = value * 10 + Int(bytes[index] - 0x30)
        }
        return value
    }
}
