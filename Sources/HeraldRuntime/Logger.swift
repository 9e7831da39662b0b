import Foundation

/// A structured logger that writes one JSON object per line, to stderr unless told otherwise, through a
/// `LogWriter` that never makes the caller wait on the output.
///
/// Metadata keys are dotted (`redis.addr`, `apns.reason`). Never pass a push token or key: log
/// `Redaction.tag(_:)` from HeraldCrypto instead.
public struct Logger: Sendable {
    public enum Level: Int, Sendable, Comparable, CustomStringConvertible {
        case debug, info, warning, error

        public static func < (lhs: Level, rhs: Level) -> Bool { lhs.rawValue < rhs.rawValue }
        public var description: String {
            switch self {
            case .debug: "debug"
            case .info: "info"
            case .warning: "warning"
            case .error: "error"
            }
        }

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
    public let writer: LogWriter

    public init(label: String, minimumLevel: Level = .info, metadata: [String: String] = [:],
                writer: LogWriter = .standardError) {
        self.label = label
        self.minimumLevel = minimumLevel
        self.metadata = metadata
        self.writer = writer
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
        writer.write(Logger.line(level: level, label: label, message: message(), fields: fields))
    }

    /// A line whose fields come already in key order (an access-log line per request): no dictionary to build,
    /// hash and sort. `fields` must be sorted by key and not repeat the logger's metadata keys.
    public func log(_ level: Level, _ message: String, sortedFields fields: [(key: String, value: String)]) {
        guard level >= minimumLevel else { return }
        guard metadata.isEmpty else {
            return log(level, message, Dictionary(fields, uniquingKeysWith: { _, new in new }))
        }
        writer.write(Logger.line(level: level, label: label, message: message, sortedFields: fields))
    }

    static func line(level: Level, label: String, message: String, fields: [String: String]) -> [UInt8] {
        line(level: level, label: label, message: message,
             sortedFields: fields.sorted { $0.key < $1.key }.map { (key: $0.key, value: $0.value) })
    }

    /// One line's bytes, written straight into one buffer: building a `String` piece by piece cost most of an
    /// access-log line.
    static func line(level: Level, label: String, message: String,
                     sortedFields fields: [(key: String, value: String)]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(320)
        out += #"{"ts":""#.utf8
        appendTimestamp(to: &out)
        out += #"","level":""#.utf8
        out += level.description.utf8
        out += #"","logger":"#.utf8
        JSONValue.appendQuoted(label, to: &out)
        out += #","msg":"#.utf8
        JSONValue.appendQuoted(message, to: &out)
        for (key, value) in fields where !Self.reserved(key) {
            out.append(UInt8(ascii: ","))
            JSONValue.appendQuoted(key, to: &out)
            out.append(UInt8(ascii: ":"))
            JSONValue.appendQuoted(value, to: &out)
        }
        out += "}\n".utf8
        return out
    }

    private static func reserved(_ key: String) -> Bool {
        switch key {
        case "ts", "level", "logger", "msg": true
        default: false
        }
    }

    /// `2026-12-02T00:24:34.820Z`, digit by digit: `String(format:)` cost more than the rest of a line.
    private static func appendTimestamp(to out: inout [UInt8]) {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var seconds = now.tv_sec
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func put(_ value: Int, digits: Int, then separator: UInt8) {
            var divisor = 1
            for _ in 1..<digits { divisor *= 10 }
            while divisor > 0 {
                out.append(UInt8(ascii: "0") + UInt8(value / divisor % 10))
                divisor /= 10
            }
            out.append(separator)
        }
        put(Int(parts.tm_year) + 1900, digits: 4, then: UInt8(ascii: "-"))
        put(Int(parts.tm_mon) + 1, digits: 2, then: UInt8(ascii: "-"))
        put(Int(parts.tm_mday), digits: 2, then: UInt8(ascii: "T"))
        put(Int(parts.tm_hour), digits: 2, then: UInt8(ascii: ":"))
        put(Int(parts.tm_min), digits: 2, then: UInt8(ascii: ":"))
        put(Int(parts.tm_sec), digits: 2, then: UInt8(ascii: "."))
        put(Int(now.tv_nsec / 1_000_000), digits: 3, then: UInt8(ascii: "Z"))
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
