import Foundation
import HeraldRuntime

/// Appends JSON lines to a file with single write(2)s of whole lines on an `O_APPEND` descriptor: lines from
/// concurrent connections never interleave. A connection collects the lines of the answers it is about to send
/// (`RecordBuffer`) and writes them before it writes those answers to its socket, so a line is in the file
/// (visible to other processes) before its response can reach the client — with one write per batch of
/// answers instead of one per push.
final class LineRecorder: Sendable {
    private let descriptor: Int32

    init(path: String) throws(ConfigurationError) {
        let fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        guard fd >= 0 else {
            throw ConfigurationError("record", "cannot open \(path): \(String(cString: strerror(errno)))")
        }
        descriptor = fd
    }

    deinit { close(descriptor) }

    func append(_ value: JSONValue) {
        var line = value.encoded()
        line.append(UInt8(ascii: "\n"))
        append(lines: line)
    }

    /// Writes `lines` (complete lines, each ending in a newline) in one write(2) when the kernel takes it whole.
    func append(lines: [UInt8]) {
        lines.withUnsafeBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let written = write(descriptor, buffer.baseAddress! + offset, buffer.count - offset)
                if written < 0, errno == EINTR { continue }
                if written <= 0 { return }
                offset += written
            }
        }
    }
}

/// Builds the record lines. Accepted pushes (`--record`):
/// `{"time": ms, "status": 200, "apnsId", "token", "topic", "pushType", "priority", "expiration" (or null),
/// "collapseId" (or null), "payload": {...}, "connection": n, "providerTokenIssuedAt": iat}` (the provider token's
/// `iat`, so tests can tell which token, and how many, a client used).
/// Rejected requests (`--record-rejected`) have the same keys where known, `status` ≥ 400, `reason`, and
/// `timestamp` for 410; `payload` is omitted, `payloadBytes` gives the body size.
enum RecordLine {
    /// Appends an accepted push's line, newline included, to `out`: the bytes `JSONValue.encoded()` gives for
    /// that object (keys in sorted order), written without building the object — this runs for every push.
    static func appendAccepted(_ push: AcceptedPush, apnsID: String, time: Double, connection: Int,
                               to out: inout [UInt8]) {
        out += #"{"apnsId":"#.utf8
        appendString(apnsID, to: &out)
        out += #","collapseId":"#.utf8
        if let collapseID = push.collapseID { appendString(collapseID, to: &out) } else { out += "null".utf8 }
        out += #","connection":"#.utf8
        JSONValue.number(Double(connection)).serialize(into: &out)
        out += #","expiration":"#.utf8
        if let expiration = push.expiration { JSONValue.number(Double(expiration)).serialize(into: &out) } else {
            out += "null".utf8
        }
        out += #","payload":"#.utf8
        push.payload.serialize(into: &out)
        out += #","priority":"#.utf8
        JSONValue.number(Double(push.priority)).serialize(into: &out)
        out += #","providerTokenIssuedAt":"#.utf8
        JSONValue.number(push.providerTokenIssuedAt).serialize(into: &out)
        out += #","pushType":"#.utf8
        appendString(push.pushType.rawValue, to: &out)
        out += #","status":200,"time":"#.utf8
        JSONValue.number((time * 1000).rounded(.down)).serialize(into: &out)
        out += #","token":"#.utf8
        appendString(push.token, to: &out)
        out += #","topic":"#.utf8
        appendString(push.topic, to: &out)
        out += "}\n".utf8
    }

    /// A JSON string literal; text with nothing to escape (tokens, ids, topics) is copied in one piece.
    private static func appendString(_ text: String, to out: inout [UInt8]) {
        let copied: Bool? = text.utf8.withContiguousStorageIfAvailable { bytes in
            guard !bytes.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) else {
                return false
            }
            out.append(UInt8(ascii: "\""))
            out.append(contentsOf: bytes)
            out.append(UInt8(ascii: "\""))
            return true
        }
        if copied != true { JSONValue.appendQuoted(text, to: &out) }
    }

    static func rejected(_ request: IncomingRequest, rejection: APNsRejection, apnsID: String, time: Double,
                         connection: Int) -> JSONValue {
        var fields: [String: JSONValue] = [
            "time": .number((time * 1000).rounded(.down)),
            "status": .number(Double(rejection.status)),
            "reason": .string(rejection.reason),
            "apnsId": .string(apnsID),
            "method": request.method.map { .string($0) } ?? .null,
            "path": request.path.map { .string($0) } ?? .null,
            "topic": request.header("apns-topic").map { .string($0) } ?? .null,
            "pushType": request.header("apns-push-type").map { .string($0) } ?? .null,
            "payloadBytes": .number(Double(request.bodyLength)),
            "connection": .number(Double(connection)),
        ]
        if let timestamp = rejection.timestamp { fields["timestamp"] = .number(Double(timestamp)) }
        if case .success(let token) = RequestValidator.route(request) { fields["token"] = .string(token) }
        return .object(fields)
    }
}
