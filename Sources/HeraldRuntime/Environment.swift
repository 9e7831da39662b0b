import Foundation

/// A configuration value that is missing or malformed. Executables print it as a one-line reason and exit 2.
public struct ConfigurationError: Error, CustomStringConvertible {
    public var variable: String
    public var message: String

    public init(_ variable: String, _ message: String) {
        self.variable = variable
        self.message = message
    }

    public var description: String { "\(variable): \(message)" }
}

/// Reads typed `HERALD_*` settings. Only executables use it; libraries take configuration structs.
public struct EnvironmentReader: Sendable {
    public var values: [String: String]

    public init(_ values: [String: String] = ProcessInfo.processInfo.environment) {
        self.values = values
    }

    public func string(_ name: String, default fallback: String) -> String {
        guard let value = values[name], !value.isEmpty else { return fallback }
        return value
    }

    public func optionalString(_ name: String) -> String? {
        guard let value = values[name], !value.isEmpty else { return nil }
        return value
    }

    /// The text of the file the variable names (a password from a Kubernetes Secret), surrounding whitespace
    /// trimmed; nil when the variable is not set. Only the path ever appears in an error.
    public func secretFile(_ name: String) throws(ConfigurationError) -> String? {
        guard let path = optionalString(name) else { return nil }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ConfigurationError(name, "cannot read \(path)")
        }
        let text = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        guard !text.isEmpty else { throw ConfigurationError(name, "\(path) is empty") }
        return text
    }

    public func int(_ name: String, default fallback: Int, range: ClosedRange<Int> = 0...Int.max) throws -> Int {
        guard let raw = optionalString(name) else { return fallback }
        guard let value = Int(raw), range.contains(value) else {
            throw ConfigurationError(name, "expected a whole number in \(range.lowerBound)...\(range.upperBound), got \"\(raw)\"")
        }
        return value
    }

    /// A switch: `on`/`off` (also `true`/`false`, `1`/`0`, `yes`/`no`).
    public func flag(_ name: String, default fallback: Bool) throws -> Bool {
        guard let raw = optionalString(name) else { return fallback }
        switch raw.lowercased() {
        case "on", "true", "1", "yes": return true
        case "off", "false", "0", "no": return false
        default: throw ConfigurationError(name, "expected on or off, got \"\(raw)\"")
        }
    }

    /// A duration given in seconds (fractions allowed), e.g. `HERALD_…_TIMEOUT_SECONDS=2.5`.
    public func seconds(_ name: String, default fallback: Duration) throws -> Duration {
        try optionalSeconds(name) ?? fallback
    }

    /// A duration given in seconds, or nil when the variable is not set.
    public func optionalSeconds(_ name: String) throws -> Duration? {
        guard let raw = optionalString(name) else { return nil }
        guard let value = Double(raw), value >= 0, value.isFinite else {
            throw ConfigurationError(name, "expected a number of seconds, got \"\(raw)\"")
        }
        return .milliseconds(Int64(value * 1000))
    }

    /// A log level (`HERALD_LOG_LEVEL`, or `override` when a flag gave one): debug, info, warning or error.
    public func logLevel(_ name: String = "HERALD_LOG_LEVEL", default fallback: Logger.Level = .info,
                         override: String? = nil) throws -> Logger.Level {
        guard let raw = override ?? optionalString(name) else { return fallback }
        guard let level = Logger.Level(name: raw) else {
            throw ConfigurationError(name, "expected debug, info, warning or error, got \"\(raw)\"")
        }
        return level
    }

    /// `host:port`, e.g. `HERALD_INGEST_ADDR=0.0.0.0:8080`.
    public func address(_ name: String, default fallback: String) throws -> HostPort {
        let raw = string(name, default: fallback)
        guard let parsed = HostPort(raw) else {
            throw ConfigurationError(name, "expected host:port, got \"\(raw)\"")
        }
        return parsed
    }
}

/// A listening or connecting address.
public struct HostPort: Sendable, Hashable, CustomStringConvertible {
    public var host: String
    public var port: UInt16

    public init(host: String, port: UInt16) {
        self.host = host
        self.port = port
    }

    public init?(_ text: String) {
        guard let colon = text.lastIndex(of: ":"), let port = UInt16(text[text.index(after: colon)...]) else {
            return nil
        }
        var host = String(text[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { return nil }
        self.init(host: host, port: port)
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// What every executable does with its arguments: `--help` prints usage and exits 0; a configuration error
/// prints one line and exits 2.
public enum CommandLineTool {
    public static func helpRequested(_ arguments: [String] = CommandLine.arguments) -> Bool {
        arguments.dropFirst().contains { $0 == "--help" || $0 == "-h" || $0 == "help" }
    }

    public static func exitWithUsage(_ usage: String) -> Never {
        print(usage)
        exit(0)
    }

    public static func exitWithConfigurationError(_ tool: String, _ error: any Error) -> Never {
        LogWriter.standardError.flush(timeout: .seconds(2)) // lines logged so far come before the reason
        FileHandle.standardError.write(Data("\(tool): configuration error: \(error)\n".utf8))
        exit(2)
    }
}
