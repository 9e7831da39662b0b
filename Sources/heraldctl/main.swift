import Foundation
import HeraldKafka
import HeraldRedis
import HeraldRuntime

let usage = """
    heraldctl — operate Herald: API keys, Kafka topics, test sends, dead letters, replay.

    Usage:
      heraldctl keys new --app ID --kind public|secret [--user USER]
          Prints a new API key and the apps-file entry that accepts it (only the key's SHA-256 is stored).
      heraldctl keys new-secret
          Prints a new random secret for a job-signing or channel-grant secret file (keys new-secret > FILE).
      heraldctl topics create [--partitions N] [--replication-factor R]
          Creates HERALD_TOPIC_JOBS and HERALD_TOPIC_DLQ (existing topics are left as they are).
      heraldctl send --app ID (--device-token HEX | --channel NAME | --post HASH) [--payload-file FILE | --alert-title T]
                     [--environment E] [--push-type T] [--direct] [--dry-run] [--json]
          One test push through Kafka and the dispatcher (waits for its job status), or --direct to APNs.
      heraldctl dlq list [FILTERS] [--limit N] [--json]
          The failed deliveries on HERALD_TOPIC_DLQ that match, then counts by reason.
      heraldctl dlq stats [FILTERS] [--json]
          Counts of the matching dead letters by reason, status, app and push type.
      heraldctl replay [FILTERS] [--name NAME] [--dry-run] [--limit N] [--rate JOBS_PER_S] [--include-removed]
                       [--include-replayed] [--include-unsigned] [--json]
          Re-publishes the matching dead letters to HERALD_TOPIC_JOBS as device jobs, each at most once per replay.
      heraldctl redis migrate [--dry-run]
          Moves a Redis database written by an older Herald to this version's key layout (stop the services first;
          resumable: run it again if it stops). --dry-run counts what would move and changes nothing.

    Filters (all optional; lists are comma-separated):
      --app ID[,ID]           --since TIME  --until TIME (2h, 30m, 1d12h ago, or 2024-05-01T10:00:00Z, or 2024-05-01)
      --status 410,503|none   --reason BadDeviceToken,ServiceUnavailable (any case)
      --push-type alert,...   --channel NAME   --post POST_ID_HASH

    Run `heraldctl send --help`, `heraldctl dlq --help` or `heraldctl replay --help` for details and examples.

    Environment: HERALD_KAFKA_BROKERS [127.0.0.1:9092], HERALD_TOPIC_JOBS [herald.jobs], HERALD_TOPIC_DLQ [herald.dlq],
    HERALD_REDIS_URL [redis://127.0.0.1:6379/0], HERALD_JOB_SIGNING_SECRET_FILE (replay, send, dlq), HERALD_APPS_FILE
    and HERALD_APNS_PRODUCTION_URL / _SANDBOX_URL / _CA_FILE (send --direct). Kafka and Redis security as for the
    services:
    \(KafkaSecurity.usage)
    \(RedisConfiguration.usage)
    Exit codes: 0 done, 1 failed (the reason is printed), 2 bad usage or configuration; replay and send also use 3,
    replay 4 (see their --help).
    """

/// Flags of one subcommand: `--name value` pairs and value-less `--switch`es; anything else is a usage error.
struct Flags {
    private var values: [String: String] = [:]
    private var present: Set<String> = []

    init(_ arguments: ArraySlice<String>, allowed: Set<String>, switches: Set<String> = []) throws {
        var iterator = arguments.makeIterator()
        while let argument = iterator.next() {
            let name = String(argument.dropFirst(2))
            guard argument.hasPrefix("--"), allowed.contains(name) || switches.contains(name) else {
                throw ConfigurationError(argument, "unknown option (see heraldctl --help)")
            }
            if switches.contains(name) {
                present.insert(name)
                continue
            }
            guard let value = iterator.next() else { throw ConfigurationError(argument, "needs a value") }
            values[name] = value
        }
    }

    subscript(name: String) -> String? { values[name] }

    /// Whether a value-less switch such as `--json` was given.
    func has(_ name: String) -> Bool { present.contains(name) }

    func int(_ name: String, default fallback: Int, range: ClosedRange<Int>) throws -> Int {
        guard let raw = values[name] else { return fallback }
        guard let value = Int(raw), range.contains(value) else {
            throw ConfigurationError("--\(name)", "expected a whole number in \(range.lowerBound)...\(range.upperBound)")
        }
        return value
    }
}

func fail(_ message: String) -> Never {
    LogWriter.standardError.flush(timeout: .seconds(2)) // what was logged comes before the reason it stops
    FileHandle.standardError.write(Data("heraldctl: \(message)\n".utf8))
    exit(1)
}

func runCommand() async {
    let arguments = CommandLine.arguments.dropFirst()
    guard let group = arguments.first else { CommandLineTool.exitWithUsage(usage) }
    if CommandLineTool.helpRequested() {
        switch group {
        case "dlq": CommandLineTool.exitWithUsage(DLQCommand.usage)
        case "replay": CommandLineTool.exitWithUsage(ReplayCommand.usage)
        case "send": CommandLineTool.exitWithUsage(SendCommand.usage)
        default: CommandLineTool.exitWithUsage(usage)
        }
    }
    let rest = arguments.dropFirst()
    do {
        switch (group, rest.first) {
        case ("keys", "new"): try KeysCommand.new(Flags(rest.dropFirst(), allowed: ["app", "kind", "user"]))
        case ("keys", "new-secret"):
            _ = try Flags(rest.dropFirst(), allowed: [])
            KeysCommand.newSecret()
        case ("topics", "create"):
            try await TopicsCommand.create(Flags(rest.dropFirst(), allowed: ["partitions", "replication-factor"]))
        case ("dlq", "list"):
            try await DLQCommand.list(Flags(rest.dropFirst(), allowed: DLQFilter.flagNames.union(["limit"]),
                                            switches: ["json"]))
        case ("dlq", "stats"):
            try await DLQCommand.stats(Flags(rest.dropFirst(), allowed: DLQFilter.flagNames, switches: ["json"]))
        case ("send", _):
            exit(try await SendCommand.run(Flags(rest, allowed: SendCommand.flagNames, switches: SendCommand.switches)))
        case ("redis", "migrate"): try await RedisCommand.migrate(Flags(rest.dropFirst(), allowed: [], switches: ["dry-run"]))
        case ("replay", _):
            let code = try await ReplayCommand.run(Flags(rest, allowed: DLQFilter.flagNames.union(["name", "limit", "rate", "ack-timeout"]),
                                                         switches: ["dry-run", "include-removed", "include-replayed",
                                                                    "include-unsigned", "json"]))
            exit(code)
        default: throw ConfigurationError(arguments.joined(separator: " "), "unknown command (see heraldctl --help)")
        }
    } catch let error as ConfigurationError {
        CommandLineTool.exitWithConfigurationError("heraldctl", error)
    } catch let error as OperatorError {
        fail(error.description)
    } catch {
        fail("\(error)")
    }
}

await runCommand()
