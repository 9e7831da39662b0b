import Foundation
import HeraldCrypto
import HeraldRuntime
import HeraldTestSupport
import Testing

/// A built executable of this package, next to the test bundle (`swift build --build-tests` builds them all).
func executable(_ name: String) throws -> String {
    let directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    var candidates = [directory.appendingPathComponent(name).path]
    if directory.pathExtension == "xctest" {
        candidates.append(directory.deletingLastPathComponent().appendingPathComponent(name).path)
    }
    candidates.append(TestEnvironment.repositoryRoot.appendingPathComponent(".build/debug/\(name)").path)
    if let found = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) { return found }
    Issue.record("\(name) is not built (looked at \(candidates)); run swift build --build-tests")
    throw POSIXError(.ENOENT)
}

/// A free TCP port on 127.0.0.1 (bound, read back, released).
func freePort() throws -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer -> Int32 in
            guard bind(fd, pointer, length) == 0 else { return -1 }
            return getsockname(fd, pointer, &length)
        }
    }
    guard bound == 0 else { throw POSIXError(.EADDRINUSE) }
    return UInt16(bigEndian: address.sin_port)
}

/// A child process with its stderr in a file; killed at `stop()` if still running.
final class ChildProcess: @unchecked Sendable { // `process` is only touched by the test that owns it
    let name: String
    let process = Process()
    let logPath: String

    init(_ name: String, executable path: String, arguments: [String] = [], environment: [String: String],
         logPath: String) throws {
        self.name = name
        self.logPath = logPath
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        process.standardError = log
        process.standardOutput = log
        try process.run()
    }

    deinit {
        // A test that failed half-way must not leave servers behind.
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }

    var pid: Int32 { process.processIdentifier }
    var isRunning: Bool { process.isRunning }

    func signal(_ number: Int32) { kill(process.processIdentifier, number) }

    /// Waits up to `timeout` for the process to exit; its status, or nil if it is still running.
    func waitForExit(timeout: Duration) async -> Int32? {
        let clock = ContinuousClock()
        let end = clock.now + timeout
        while process.isRunning, clock.now < end { try? await Task.sleep(for: .milliseconds(50)) }
        return process.isRunning ? nil : process.terminationStatus
    }

    func stop() async {
        guard process.isRunning else { return }
        signal(SIGTERM)
        if await waitForExit(timeout: .seconds(30)) == nil {
            signal(SIGKILL)
            _ = await waitForExit(timeout: .seconds(5))
        }
    }

    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }
}

/// herald-apns-sim as a process, trusting every app's provider key, recording accepted pushes.
final class SimulatorProcess: Sendable {
    let child: ChildProcess
    let port: UInt16
    let caFile: String
    let recordPath: String
    let rulesPath: String

    init(apps: TestApps, directory: String) throws {
        port = try freePort()
        caFile = directory + "/tls/ca.pem"
        recordPath = directory + "/accepted.jsonl"
        rulesPath = directory + "/rules.json"
        try #"{"rules": []}"#.write(toFile: rulesPath, atomically: true, encoding: .utf8)
        var arguments = ["--listen", "127.0.0.1:\(port)", "--tls-dir", directory + "/tls", "--record", recordPath,
                         "--rules", rulesPath, "--log-level", "warning"]
        for app in apps.apps {
            arguments += ["--key", "\(app.teamID):\(app.keyID):\(apps.folder.appendingPathComponent("\(app.id).p8").path)"]
        }
        // herald-apns-sim does not ignore SIGPIPE: a client killed mid-stream (kill -9 below) would kill it on its
        // next write. An ignored signal survives exec, so the shell sets that up.
        child = try ChildProcess("herald-apns-sim", executable: "/bin/sh",
                                 arguments: ["-c", "trap '' PIPE; exec \"$0\" \"$@\"", try executable("herald-apns-sim")] + arguments,
                                 environment: [:], logPath: directory + "/sim.log")
    }

    var url: String { "https://127.0.0.1:\(port)" }

    func waitUntilListening() async throws {
        let port = self.port
        try await eventually("the simulator listens") {
            (try? await onThread { try RawTCP.connect(port: port) }) != nil
        }
    }

    func accepted() -> [JSONValue] { readJSONLines(recordPath) }

    /// How many pushes were accepted, counted without parsing (cheap while a fan-out runs).
    func acceptedCount() -> Int {
        guard let data = FileManager.default.contents(atPath: recordPath) else { return 0 }
        return data.reduce(0) { $0 + ($1 == UInt8(ascii: "\n") ? 1 : 0) }
    }
}

enum RawTCP {
    /// Connects and closes at once; throws when nothing listens.
    static func connect(port: UInt16) throws {
        _ = try RawHTTPClient(port: port, timeout: 1)
    }
}

/// herald-dispatcher as a process.
final class DispatcherProcess: Sendable {
    let child: ChildProcess
    let port: UInt16

    init(apps: TestApps, simulator: SimulatorProcess, topics: TestTopics, directory: String, name: String = "dispatcher",
         extra: [String: String] = [:]) throws {
        port = try freePort()
        let environment = [
            "HERALD_DISPATCHER_ADDR": "127.0.0.1:\(port)",
            "HERALD_APPS_FILE": apps.path,
            "HERALD_REDIS_URL": try TestEnvironment.redisURL(),
            "HERALD_KAFKA_BROKERS": topics.brokers,
            "HERALD_TOPIC_JOBS": topics.jobs,
            "HERALD_TOPIC_DLQ": topics.deadLetters,
            "HERALD_CONSUMER_GROUP": topics.group,
            "HERALD_APNS_PRODUCTION_URL": simulator.url,
            "HERALD_APNS_SANDBOX_URL": simulator.url,
            "HERALD_APNS_CA_FILE": simulator.caFile,
            "HERALD_KAFKA_SESSION_TIMEOUT_SECONDS": "6",
            "HERALD_KAFKA_MAX_POLL_INTERVAL_SECONDS": "10",
            "HERALD_RETRY_INITIAL_DELAY_SECONDS": "0.05",
            "HERALD_LOG_LEVEL": "info",
        ].merging(extra) { _, new in new }
        child = try ChildProcess("herald-dispatcher", executable: try executable("herald-dispatcher"),
                                 environment: environment, logPath: directory + "/\(name).log")
    }

    func get(_ path: String) async throws -> RawHTTPClient.Response {
        let port = self.port
        return try await onThread { try RawHTTPClient(port: port).request("GET", path) }
    }

    func metric(_ name: String, labels: [String: String] = [:]) async -> Double? {
        guard let response = try? await get("/metrics"), response.status == 200 else { return nil }
        return metricValue(response.text, name, labels: labels)
    }

    func waitForAssignment(timeout: Duration = .seconds(90)) async throws {
        try await eventually("\(child.name) was assigned partitions", timeout: timeout) {
            await metric("herald_dispatcher_partitions_assigned") ?? 0 > 0
        }
    }
}

/// herald-ingest as a process.
final class IngestProcess: Sendable {
    let child: ChildProcess
    let port: UInt16

    init(apps: TestApps, topics: TestTopics, directory: String) throws {
        port = try freePort()
        child = try ChildProcess("herald-ingest", executable: try executable("herald-ingest"), environment: [
            "HERALD_INGEST_ADDR": "127.0.0.1:\(port)",
            "HERALD_APPS_FILE": apps.path,
            "HERALD_REDIS_URL": try TestEnvironment.redisURL(),
            "HERALD_KAFKA_BROKERS": topics.brokers,
            "HERALD_TOPIC_JOBS": topics.jobs,
            "HERALD_LOG_LEVEL": "warning",
        ], logPath: directory + "/ingest.log")
    }

    func request(_ method: String, _ path: String, key: String, json body: String) async throws -> RawHTTPClient.Response {
        let port = self.port
        return try await onThread {
            try RawHTTPClient(port: port).request(method, path, headers: ["X-API-Key": key, "Content-Type": "application/json"],
                                                  body: body)
        }
    }

    func waitUntilReady() async throws {
        let port = self.port
        try await eventually("herald-ingest is ready") {
            (try? await onThread { try RawHTTPClient(port: port).request("GET", "/readyz") })?.status == 200
        }
    }
}

/// A scratch folder for one process-level test (logs, records, TLS files); a test removes it when it passes, so a
/// failed test leaves its processes' logs behind (the path is printed).
func scratchDirectory() throws -> String {
    let path = NSTemporaryDirectory() + "herald-disp-proc-" + SecureRandom.hex(6)
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    print("process logs in \(path)")
    return path
}
