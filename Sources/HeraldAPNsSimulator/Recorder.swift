import Foundation
import HeraldRuntime

/// Appends one JSON object per line to a file, each line with a single write(2) on an `O_APPEND` descriptor:
/// a line is in the file (visible to other processes) as soon as the response is sent, and lines from
/// concurrent connections never interleave.
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
        line.withUnsafeBytes { buffer in
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
    static func accepted(_ push: AcceptedPush, apnsID: String, time: Double, connection: Int) -> JSONValue {
        .object([
            "time": .number((time * 1000).rounded(.down)),
            "status": .number(200),
            "apnsId": .string(apnsID),
            "token": .string(push.token),
            "topic": .string(push.topic),
            "pushType": .string(push.pushType.rawValue),
            "priority": .number(Double(push.priority)),
            "expiration": push.expiration.map { .number(Double($0)) } ?? .null,
            "collapseId": push.collapseID.map { .string($0) } ?? .null,
            "payload": push.payload,
            "connection": .number(Double(connection)),
            "providerTokenIssuedAt": .number(push.providerTokenIssuedAt),
        ])
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
