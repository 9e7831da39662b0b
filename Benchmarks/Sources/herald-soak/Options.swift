import Foundation
import HeraldRuntime

/// herald-soak's command line (scripts/soak passes every value; the defaults suit a manual run).
struct Options: Sendable {
    var ingestPort: UInt16 = 8080
    var brokers = "127.0.0.1:9092"
    var dlqTopic = "herald.dlq"
    var app = "soak"
    var publicKey = ""
    var secretKey = ""
    var bundleID = "com.example.soak"
    var recordFile = ""
    var rejectedFile = ""
    var seconds = 120.0
    var rate = 200.0
    var workers = 8
    var channels = 40
    var subscribersPerChannel = 10
    /// When the after-warm-up RSS is taken: 10% of the run, at least 30 s.
    var warmUpSeconds: Double?
    var drainTimeoutSeconds = 90.0
    /// Fail when an ingest/dispatcher RSS at the end exceeds its after-warm-up value by more than this percentage.
    var rssGrowthLimitPercent = 10.0
    var enforceRSS = false
    var processes: [(name: String, pid: Int32)] = []

    static let usage = """
        herald-soak — mixed load against a running Herald stack, then an accounting of every accepted push.

        Usage:
          herald-soak rules                 print the simulator rules file the token classes rely on
          herald-soak run OPTIONS           run the load, wait for the pushes to settle, report; exit 1 on a failure

        Run options:
          --ingest-port P  --brokers HOST:PORT  --dlq-topic T  --app ID  --public-key K  --secret-key K
          --bundle-id B  --record FILE (simulator's accepted pushes)  --rejected FILE (its rejected requests)
          --seconds S (120)  --rate REQ_PER_S (200)  --workers N (8)  --channels N (40)  --subscribers N (10)
          --warm-up S (10% of the run, at least 30)  --drain-timeout S (90)
          --pid NAME=PID (repeatable: processes whose RSS is reported)
          --enforce-rss (fail when ingest's or dispatcher's end RSS exceeds the warm-up value by more than
          --rss-growth-limit PERCENT, default 10)
        """

    init(_ arguments: ArraySlice<String>) throws(ConfigurationError) {
        var iterator = arguments.makeIterator()
        while let flag = iterator.next() {
            if flag == "--enforce-rss" {
                enforceRSS = true
                continue
            }
            guard let value = iterator.next() else { throw ConfigurationError(flag, "missing value") }
            switch flag {
            case "--ingest-port":
                guard let port = UInt16(value) else { throw ConfigurationError(flag, "not a port") }
                ingestPort = port
            case "--brokers": brokers = value
            case "--dlq-topic": dlqTopic = value
            case "--app": app = value
            case "--public-key": publicKey = value
            case "--secret-key": secretKey = value
            case "--bundle-id": bundleID = value
            case "--record": recordFile = value
            case "--rejected": rejectedFile = value
            case "--seconds": seconds = try Self.number(flag, value)
            case "--rate": rate = try Self.number(flag, value)
            case "--workers": workers = Int(try Self.number(flag, value))
            case "--channels": channels = Int(try Self.number(flag, value))
            case "--subscribers": subscribersPerChannel = Int(try Self.number(flag, value))
            case "--warm-up": warmUpSeconds = try Self.number(flag, value)
            case "--drain-timeout": drainTimeoutSeconds = try Self.number(flag, value)
            case "--rss-growth-limit": rssGrowthLimitPercent = try Self.number(flag, value)
            case "--pid":
                let parts = value.split(separator: "=")
                guard parts.count == 2, let pid = Int32(parts[1]) else { throw ConfigurationError(flag, "expected NAME=PID") }
                processes.append((String(parts[0]), pid))
            default: throw ConfigurationError(flag, "unknown option")
            }
        }
        guard !publicKey.isEmpty, !secretKey.isEmpty else { throw ConfigurationError("--public-key", "both keys are required") }
        guard !recordFile.isEmpty, !rejectedFile.isEmpty else { throw ConfigurationError("--record", "both record files are required") }
        guard workers >= 1, channels >= 1, subscribersPerChannel >= 3 else {
            throw ConfigurationError("--workers", "need at least 1 worker, 1 channel and 3 subscribers per channel")
        }
    }

    /// The after-warm-up sampling point.
    var warmUp: Double { warmUpSeconds ?? min(max(30, seconds * 0.1), seconds / 2) }

    private static func number(_ flag: String, _ value: String) throws(ConfigurationError) -> Double {
        guard let parsed = Double(value), parsed > 0 else { throw ConfigurationError(flag, "must be a positive number") }
        return parsed
    }
}
