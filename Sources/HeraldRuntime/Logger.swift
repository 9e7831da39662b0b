import Foundation

/// A structured logger that writes one JSON object per line to stderr.
///
/// Metadata keys are dotted (`redis.addr`, `apns.reason`). Never pass a push token or key: log
/// `Redaction.tag(_:)` from HeraldCrypto instead.
public struct Logger: Sendable {
    public enum Level: Int, Sendable, Comparable, CustomStringConvertible {
        case debug, info, warning, error

        public static func < (lhs: Level, rhs: Level) -> Bool { lhs.rawValue < rhs.rawValue }
        public var description: String { ["debug", "info", "warning", "error"][rawValue] }

        public init?(name: String) {
            switch name.lowercased() {
            case "debug": self = .debug
            case "info": self = .info
            case "warning", "warn": self = .warning
            case "error": self = .error
            default: return nil
            }
        }
    }

    public var label: String
    public var minimumLevel: Level
    public var metadata: [String: String]

    public init(label: String, minimumLevel: Level = .info, metadata: [String: String] = [:]) {
        self.label = label
        self.minimumLevel = minimumLevel
        self.metadata = metadata
    }

    /// A copy that adds `metadata` to every line it writes.
    public func with(_ metadata: [String: String]) -> Logger {
        var copy = self
        copy.metadata.merge(metadata) { _, new in new }
        return copy
    }

    public func debug(_ message: @autoclosure () -> String, _ metadata: [String: String] = [:]) {
        log(.debug, message(), metadata)
    }
    public func info(_ message: @autoclosure () -> String, _ metadata: [String: String] = [:]) {
        log(.info, message(), metadata)
    }
    public func warning(_ message: @autoclosure () -> String, _ metadata: [String: String] = [:]) {
        log(.warning, message(), metadata)
    }
    public func error(_ message: @autoclosure () -> String, _ metadata: [String: String] = [:]) {
        log(.error, message(), metadata)
    }

    public func log(_ level: Level, _ message: @autoclosure () -> String, _ extra: [String: String] = [:]) {
        guard level >= minimumLevel else { return }
        var fields = metadata
        fields.merge(extra) { _, new in new }
        LogSink.shared.write(Logger.line(level: level, label: label, message: message(), fields: fields))
    }

    static func line(level: Level, label: String, message: String, fields: [String: String]) -> String {
        var out = "{\"ts\":\"\(timestamp())\",\"level\":\"\(level)\",\"logger\":"
        JSONText.appendQuoted(label, to: &out)
        out += ",\"msg\":"
        JSONText.appendQuoted(message, to: &out)
        for key in fields.keys.sorted() where !["ts", "level", "logger", "msg"].contains(key) {
            out += ","
            JSONText.appendQuoted(key, to: &out)
            out += ":"
            JSONText.appendQuoted(fields[key]!, to: &out)
        }
        out += "}\n"
        return out
    }

    private static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var seconds = now.tv_sec
        var parts = tm()
        gmtime_r(&seconds, &parts)
        let millis = now.tv_nsec / 1_000_000
        return String(format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", parts.tm_year + 1900, parts.tm_mon + 1,
                      parts.tm_mday, parts.tm_hour, parts.tm_min, parts.tm_sec, millis)
    }
}

/// Serialises whole lines onto stderr so lines from many threads never interleave.
final class LogSink: Sendable {
    static let shared = LogSink()
    /// The line being written, reused across lines. The lock guards a real value rather than `()`: ThreadSanitizer
    /// reported a race on the zero-sized value of `Lock(())` between a holder and a thread about to lock.
    private let pending = Lock([UInt8]())

    func write(_ line: String) {
        pending.withLock { bytes in
            bytes.removeAll(keepingCapacity: true)
            bytes.append(contentsOf: line.utf8)
            var offset = 0
            while offset < bytes.count {
                let written = bytes.withUnsafeMutableBytes { buffer in
                    Foundation.write(2, buffer.baseAddress! + offset, buffer.count - offset)
                }
                if written <= 0 { if errno == EINTR { continue } else { return } }
                offset += written
            }
        }
    }
}

/// Minimal JSON string escaping for log lines and metric labels (no Foundation encoder on the hot path).
public enum JSONText {
    public static func appendQuoted(_ string: String, to out: inout String) {
        out += "\""
        for scalar in string.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case let c where c.value < 0x20:
                out += String(format: "\\u%04x", c.value)
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }

    public static func quoted(_ string: String) -> String {
        var out = ""
        appendQuoted(string, to: &out)
        return out
    }
}
