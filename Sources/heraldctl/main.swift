import Foundation
import HeraldRuntime

let usage = """
    heraldctl — operate Herald: API keys, Kafka topics, dead letters, replay.

    Usage:
      heraldctl keys new --app ID --kind public|secret [--user USER]
          Prints a new API key and the apps-file entry that accepts it (only the key's SHA-256 is stored).
      heraldctl topics create [--partitions N] [--replication-factor R]
          Creates HERALD_TOPIC_JOBS and HERALD_TOPIC_DLQ (existing topics are left as they are).

    Environment: HERALD_KAFKA_BROKERS [127.0.0.1:9092], HERALD_TOPIC_JOBS [herald.jobs], HERALD_TOPIC_DLQ [herald.dlq].
    Exit codes: 0 done, 1 failed (the reason is printed), 2 bad usage or configuration.
    """

/// Flags of one subcommand: `--name value` pairs; anything else is a usage error.
struct Flags {
    private var values: [String: String] = [:]

    init(_ arguments: ArraySlice<String>, allowed: Set<String>) throws {
        var iterator = arguments.makeIterator()
        while let argument = iterator.next() {
            guard argument.hasPrefix("--"), allowed.contains(String(argument.dropFirst(2))) else {
                throw ConfigurationError(argument, "unknown option (see heraldctl --help)")
            }
            guard let value = iterator.next() else { throw ConfigurationError(argument, "needs a value") }
            values[String(argument.dropFirst(2))] = value
        }
    }

    subscript(name: String) -> String? { values[name] }

    func int(_ name: String, default fallback: Int, range: ClosedRange<Int>) throws -> Int {
        guard let raw = values[name] else { return fallback }
        guard let value = Int(raw), range.contains(value) else {
            throw ConfigurationError("--\(name)", "expected a whole number in \(range.lowerBound)...\(range.upperBound)")
        }
        return value
    }
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("heraldctl: \(message)\n".utf8))
    exit(1)
}

func runCommand() async {
    let arguments = CommandLine.arguments.dropFirst()
    guard let group = arguments.first, !CommandLineTool.helpRequested() else { CommandLineTool.exitWithUsage(usage) }
    let rest = arguments.dropFirst()
    do {
        switch (group, rest.first) {
        case ("keys", "new"): try KeysCommand.new(Flags(rest.dropFirst(), allowed: ["app", "kind", "user"]))
        case ("topics", "create"):
            try await TopicsCommand.create(Flags(rest.dropFirst(), allowed: ["partitions", "replication-factor"]))
        default: throw ConfigurationError(arguments.joined(separator: " "), "unknown command (see heraldctl --help)")
        }
    } catch let error as ConfigurationError {
        CommandLineTool.exitWithConfigurationError("heraldctl", error)
    } catch {
        fail("\(error)")
    }
}

await runCommand()
