import Foundation
import HeraldCrypto
import HeraldRuntime

/// A built executable of this package, next to the test bundle (`swift build --build-tests` builds them all).
public func builtExecutable(_ name: String) throws -> String {
    let directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    var candidates = [directory.appendingPathComponent(name).path]
    if directory.pathExtension == "xctest" {
        candidates.append(directory.deletingLastPathComponent().appendingPathComponent(name).path)
    }
    candidates.append(TestEnvironment.repositoryRoot.appendingPathComponent(".build/debug/\(name)").path)
    if let found = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) { return found }
    throw TestEnvironment.Missing(description: "\(name) is not built (looked at \(candidates)); run swift build --build-tests")
}

/// A free TCP port on 127.0.0.1 for a child process to listen on, never the same one twice in a run.
///
/// Taken from below Linux's ephemeral range (32768–60999): a port the kernel hands out for port 0 is released
/// before the child binds it, and any outgoing connection (Redis, the broker, a test client) may take it as its
/// local port in between, so the child's bind would fail with EADDRINUSE.
public func freePort() throws -> UInt16 {
    try handedOutPorts.withLock { handedOut in
        for _ in 0..<200 {
            let candidate = UInt16.random(in: 20_000...32_000)
            guard !handedOut.contains(candidate) else { continue }
            if try bindsOnLoopback(candidate) {
                handedOut.insert(candidate)
                return candidate
            }
        }
        throw TestEnvironment.Missing(description: "no free port in 20000–32000 after 200 tries")
    }
}

private let handedOutPorts = Lock<Set<UInt16>>([])

/// Whether `port` can be bound on 127.0.0.1 now (without SO_REUSEADDR, so a port in TIME_WAIT counts as taken).
private func bindsOnLoopback(_ port: UInt16) throws -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = port.bigEndian
    let bound = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    if bound == 0 { return true }
    guard errno == EADDRINUSE || errno == EACCES else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    return false
}

/// A running process's core file limit ("Max core file size" in /proc/<pid>/limits): soft and hard.
public func coreFileLimit(pid: Int32) -> (soft: String, hard: String)? {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/limits", encoding: .utf8),
          let line = text.split(separator: "\n").first(where: { $0.hasPrefix("Max core file size") }) else { return nil }
    let fields = line.dropFirst("Max core file size".count).split(separator: " ")
    guard fields.count >= 2 else { return nil }
    return (String(fields[0]), String(fields[1]))
}

/// Thrown by `eventually` when its condition did not hold in time.
public struct TimedOut: Error, CustomStringConvertible {
    public var what: String
    public var description: String { "timed out waiting until \(what)" }
}

/// Polls `condition` every 50 ms until it holds; throws `TimedOut` (which fails the test) after `timeout`.
public func eventually(_ what: String, timeout: Duration = .seconds(20),
                       _ condition: @Sendable () async throws -> Bool) async throws {
    let clock = ContinuousClock()
    let end = clock.now + timeout
    while clock.now < end {
        if try await condition() { return }
        try await Task.sleep(for: .milliseconds(50))
    }
    throw TimedOut(what: what)
}

/// Every line of a JSON-lines file that parses (a line being written may be cut short).
public func readJSONLines(_ path: String) -> [JSONValue] {
    guard let data = FileManager.default.contents(atPath: path) else { return [] }
    return data.split(separator: UInt8(ascii: "\n")).compactMap { try? JSONDecoder().decode(JSONValue.self, from: Data($0)) }
}

/// Sums the samples of `name` whose labels include `labels` in Prometheus text.
public func metricValue(_ text: String, _ name: String, labels: [String: String] = [:]) -> Double? {
    var total: Double?
    for line in text.split(separator: "\n") where !line.hasPrefix("#") {
        guard line.hasPrefix(name) else { continue }
        let rest = line.dropFirst(name.count)
        guard rest.first == " " || rest.first == "{" else { continue }
        if !labels.allSatisfy({ rest.contains("\($0.key)=\"\($0.value)\"") }) { continue }
        guard let value = line.split(separator: " ").last.flatMap({ Double($0) }) else { continue }
        total = (total ?? 0) + value
    }
    return total
}

/// A scratch folder for one process-level test (logs, records, TLS files); a test removes it when it passes, so a
/// failed test leaves its processes' logs behind (the path is printed).
public func scratchDirectory(_ prefix: String = "herald-proc-") throws -> String {
    let path = NSTemporaryDirectory() + prefix + SecureRandom.hex(6)
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    print("process logs in \(path)")
    return path
}

/// A child process with its stdout and stderr in a file; killed at `stop()` if still running.
///
/// With `HERALD_TEST_LOG_DIR` set, the log is written in that folder (under a unique name, kept after the test) and
/// `logPath` is a symbolic link to it, so that `scripts/ci/scan-logs` can check every child's log of a whole run.
public final class ChildProcess: @unchecked Sendable { // `process` is only touched by the test that owns it
    public let name: String
    public let process = Process()
    public let logPath: String

    /// Where the log is written: in `HERALD_TEST_LOG_DIR` when set (with `logPath` linked to it), else `logPath`.
    private static func logFile(for logPath: String, name: String) throws -> String {
        guard let folder = ProcessInfo.processInfo.environment["HERALD_TEST_LOG_DIR"], !folder.isEmpty else {
            return logPath
        }
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        let base = URL(fileURLWithPath: logPath).deletingPathExtension().lastPathComponent
        let file = folder + "/\(name)-\(base)-\(SecureRandom.hex(4)).log"
        _ = FileManager.default.createFile(atPath: file, contents: nil)
        try? FileManager.default.removeItem(atPath: logPath) // a restarted process reuses its path
        try FileManager.default.createSymbolicLink(atPath: logPath, withDestinationPath: file)
        return file
    }

    public init(_ name: String, executable path: String, arguments: [String] = [], environment: [String: String],
                logPath: String) throws {
        self.name = name
        self.logPath = logPath
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
        let file = try Self.logFile(for: logPath, name: name)
        if file == logPath { _ = FileManager.default.createFile(atPath: logPath, contents: nil) }
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: file))
        process.standardError = log
        process.standardOutput = log
        try process.run()
    }

    deinit {
        // A test that failed half-way must not leave servers behind.
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }

    public var pid: Int32 { process.processIdentifier }
    public var isRunning: Bool { process.isRunning }

    public func signal(_ number: Int32) { kill(process.processIdentifier, number) }

    /// The signal the process died of; nil while it runs or when it exited.
    public var diedOfSignal: Int32? {
        process.isRunning || process.terminationReason != .uncaughtSignal ? nil : process.terminationStatus
    }

    /// Waits up to `timeout` for the process to exit; its status, or nil if it is still running.
    public func waitForExit(timeout: Duration) async -> Int32? {
        let clock = ContinuousClock()
        let end = clock.now + timeout
        while process.isRunning, clock.now < end { try? await Task.sleep(for: .milliseconds(50)) }
        return process.isRunning ? nil : process.terminationStatus
    }

    /// SIGKILL, then waits up to 10 s for the exit: a crash (no goodbye to clients, nothing flushed). Also the way
    /// to stop a child that may have inherited an ignored SIGTERM from the test process.
    public func crash() async {
        signal(SIGKILL)
        _ = await waitForExit(timeout: .seconds(10))
    }

    /// SIGTERM, then SIGKILL if it has not exited 30 s later.
    public func stop() async {
        guard process.isRunning else { return }
        signal(SIGTERM)
        if await waitForExit(timeout: .seconds(30)) == nil {
            signal(SIGKILL)
            _ = await waitForExit(timeout: .seconds(5))
        }
    }

    /// Everything the process wrote so far.
    public var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }
}

/// herald-apns-sim as a process, trusting every app's provider key, recording accepted pushes, failing as its rules
/// file says (see `setRules`).
public final class SimulatorProcess: Sendable {
    public let child: ChildProcess
    public let port: UInt16
    public let caFile: String
    public let recordPath: String
    public let rulesPath: String
    /// The channel management listener (iOS 18 broadcast).
    public let managePort: UInt16
    public let broadcastRecordPath: String

    /// Starts the simulator with `rules` in force from its first request; `noBroadcast` bundles lack the
    /// Broadcast capability.
    public init(apps: TestApps, directory: String, rules: [JSONValue] = [], noBroadcast: [String] = []) throws {
        port = try freePort()
        managePort = try freePort()
        caFile = directory + "/tls/ca.pem"
        recordPath = directory + "/accepted.jsonl"
        rulesPath = directory + "/rules.json"
        broadcastRecordPath = directory + "/broadcasts.jsonl"
        try Self.write(rules: rules, to: rulesPath)
        var arguments = ["--listen", "127.0.0.1:\(port)", "--tls-dir", directory + "/tls", "--record", recordPath,
                         "--rules", rulesPath, "--log-level", "warning", "--manage-listen", "127.0.0.1:\(managePort)",
                         "--record-broadcasts", broadcastRecordPath]
        for bundle in noBroadcast { arguments += ["--no-broadcast", bundle] }
        // Each app's bundle id belongs to its team: a push signed with another app's key is refused.
        for app in apps.apps {
            arguments += ["--key", "\(app.teamID):\(app.keyID):\(apps.folder.appendingPathComponent("\(app.id).p8").path)",
                          "--topic", "\(app.teamID):\(app.bundleID)"]
        }
        child = try ChildProcess("herald-apns-sim", executable: try builtExecutable("herald-apns-sim"),
                                 arguments: arguments, environment: [:], logPath: directory + "/sim.log")
    }

    /// The URL to give the dispatcher as its APNs host.
    public var url: String { "https://127.0.0.1:\(port)" }
    /// The URL to give the dispatcher as its channel management host.
    public var manageURL: String { "https://127.0.0.1:\(managePort)" }

    public func waitUntilListening() async throws {
        let port = self.port
        try await eventually("the simulator listens") {
            (try? await onThread { _ = try RawHTTPClient(port: port, timeout: 1) }) != nil
        }
    }

    /// Replaces the simulator's rules file atomically (`{"rules": [...]}`); the simulator re-reads it on change.
    /// It checks the file at most every 100 ms, on the next request.
    public func setRules(_ rules: [JSONValue]) throws { try Self.write(rules: rules, to: rulesPath) }

    private static func write(rules: [JSONValue], to path: String) throws {
        let data = try JSONEncoder().encode(JSONValue.object(["rules": .array(rules)]))
        try data.write(to: URL(fileURLWithPath: path), options: .atomic) // a temporary file renamed over the old
    }

    /// Every push accepted so far (one record line each).
    public func accepted() -> [JSONValue] { readJSONLines(recordPath) }

    /// Every broadcast accepted so far.
    public func broadcasts() -> [JSONValue] { readJSONLines(broadcastRecordPath) }

    /// How many pushes were accepted, counted without parsing (cheap while a fan-out runs).
    public func acceptedCount() -> Int {
        guard let data = FileManager.default.contents(atPath: recordPath) else { return 0 }
        return data.reduce(0) { $0 + ($1 == UInt8(ascii: "\n") ? 1 : 0) }
    }
}

/// herald-dispatcher as a process against the simulator, with Tansu-friendly group settings and short retries.
public final class DispatcherProcess: Sendable {
    public let child: ChildProcess
    /// The health and metrics port.
    public let port: UInt16

    public init(apps: TestApps, simulator: SimulatorProcess, brokers: String, jobsTopic: String, deadLetterTopic: String,
                group: String, directory: String, name: String = "dispatcher", extra: [String: String] = [:]) throws {
        port = try freePort()
        let environment = [
            "HERALD_DISPATCHER_ADDR": "127.0.0.1:\(port)",
            "HERALD_APPS_FILE": apps.path, "HERALD_JOB_SIGNING_SECRET_FILE": apps.jobSigningSecretPath,
            "HERALD_REDIS_URL": try TestEnvironment.redisURL(),
            "HERALD_KAFKA_BROKERS": brokers,
            "HERALD_TOPIC_JOBS": jobsTopic,
            "HERALD_TOPIC_DLQ": deadLetterTopic,
            "HERALD_CONSUMER_GROUP": group,
            "HERALD_APNS_PRODUCTION_URL": simulator.url,
            "HERALD_APNS_SANDBOX_URL": simulator.url,
            "HERALD_APNS_CA_FILE": simulator.caFile,
            "HERALD_APNS_MANAGE_PRODUCTION_URL": simulator.manageURL,
            "HERALD_APNS_MANAGE_SANDBOX_URL": simulator.manageURL,
            "HERALD_KAFKA_SESSION_TIMEOUT_SECONDS": "6",
            "HERALD_KAFKA_MAX_POLL_INTERVAL_SECONDS": "10",
            "HERALD_KAFKA_FETCH_STALL_SECONDS": "30",
            "HERALD_RETRY_INITIAL_DELAY_SECONDS": "0.05",
            "HERALD_LOG_LEVEL": "info",
        ].merging(extra) { _, new in new }
        child = try ChildProcess("herald-dispatcher", executable: try builtExecutable("herald-dispatcher"),
                                 environment: environment, logPath: directory + "/\(name).log")
    }

    public func get(_ path: String) async throws -> RawHTTPClient.Response {
        let port = self.port
        return try await onThread { try RawHTTPClient(port: port).request("GET", path) }
    }

    /// A metric's value from `/metrics` (summed over children matching `labels`), nil when unreachable or absent.
    public func metric(_ name: String, labels: [String: String] = [:]) async -> Double? {
        guard let response = try? await get("/metrics"), response.status == 200 else { return nil }
        return metricValue(response.text, name, labels: labels)
    }

    public func waitForAssignment(timeout: Duration = .seconds(90)) async throws {
        try await eventually("\(child.name) was assigned partitions", timeout: timeout) {
            await metric("herald_dispatcher_partitions_assigned") ?? 0 > 0
        }
    }
}
