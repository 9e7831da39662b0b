import Foundation
import HeraldTestSupport
import Testing

/// A real `herald-ingest` process, its stderr and stdout in a file, on a port it picked itself.
final class IngestProcess {
    let process = Process()
    let logURL: URL
    private let log: FileHandle
    private(set) var port: UInt16 = 0

    /// Starts the executable with the test services and `apps`, plus `environment` on top.
    init(apps: TestApps, environment: [String: String]) async throws {
        logURL = apps.folder.appendingPathComponent("ingest-\(UUID().uuidString.prefix(8)).log")
        _ = FileManager.default.createFile(atPath: logURL.path, contents: nil)
        log = try FileHandle(forWritingTo: logURL)
        process.executableURL = try ingestExecutable()
        process.environment = ProcessInfo.processInfo.environment.merging([
            "HERALD_INGEST_ADDR": "127.0.0.1:0", "HERALD_APPS_FILE": apps.path,
            "HERALD_JOB_SIGNING_SECRET_FILE": apps.jobSigningSecretPath,
            "HERALD_REDIS_URL": try TestEnvironment.redisURL(), "HERALD_KAFKA_BROKERS": try TestEnvironment.kafkaBrokers(),
        ].merging(environment) { _, new in new }) { _, new in new }
        process.standardOutput = log
        process.standardError = log
        try process.run()
        port = try await listeningPort(logURL)
    }

    /// SIGTERM, then everything the process wrote.
    func stop() async throws -> String {
        process.terminate()
        let deadline = ContinuousClock.now + .seconds(15)
        while process.isRunning, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(50)) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        try log.close()
        return try String(contentsOf: logURL, encoding: .utf8)
    }
}

/// The `herald-ingest` executable `swift build` put next to the test bundle.
func ingestExecutable() throws -> URL {
    let folder = (Bundle.main.executableURL ?? URL(fileURLWithPath: CommandLine.arguments[0])).deletingLastPathComponent()
    let url = folder.appendingPathComponent("herald-ingest")
    guard FileManager.default.isExecutableFile(atPath: url.path) else {
        throw HarnessFailure( "\(url.path) is missing: build it first (scripts/test runs swift build --build-tests)")
    }
    return url
}

/// The port from herald-ingest's `listening` log line (it was started on port 0).
func listeningPort(_ log: URL) async throws -> UInt16 {
    let deadline = ContinuousClock.now + .seconds(20)
    while ContinuousClock.now < deadline {
        let text = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
        for line in text.split(separator: "\n") where line.contains("\"msg\":\"listening\"") {
            if let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
               let address = object["addr"] as? String, let port = address.split(separator: ":").last.flatMap({ UInt16($0) }) {
                return port
            }
        }
        try await Task.sleep(for: .milliseconds(50))
    }
    throw HarnessFailure( "herald-ingest did not log `listening` in 20 s: \(try String(contentsOf: log, encoding: .utf8))")
}

/// The test setup itself failed (an executable missing, a process that never came up).
struct HarnessFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
