import Foundation
import HeraldCrypto
import HeraldRuntime
import HeraldTestSupport
import Testing

extension DispatcherProcess {
    convenience init(apps: TestApps, simulator: SimulatorProcess, topics: TestTopics, directory: String,
                     name: String = "dispatcher", extra: [String: String] = [:]) throws {
        try self.init(apps: apps, simulator: simulator, brokers: topics.brokers, jobsTopic: topics.jobs,
                      deadLetterTopic: topics.deadLetters, group: topics.group, directory: directory, name: name,
                      extra: extra)
    }
}

/// herald-ingest as a process.
final class IngestProcess: Sendable {
    let child: ChildProcess
    let port: UInt16

    init(apps: TestApps, topics: TestTopics, directory: String, name: String = "ingest",
         extra: [String: String] = [:]) throws {
        port = try freePort()
        child = try ChildProcess("herald-ingest", executable: try builtExecutable("herald-ingest"), environment: [
            "HERALD_INGEST_ADDR": "127.0.0.1:\(port)",
            "HERALD_APPS_FILE": apps.path, "HERALD_JOB_SIGNING_SECRET_FILE": apps.jobSigningSecretPath,
            "HERALD_REDIS_URL": try TestEnvironment.redisURL(),
            "HERALD_KAFKA_BROKERS": topics.brokers,
            "HERALD_TOPIC_JOBS": topics.jobs,
            "HERALD_LOG_LEVEL": "warning",
        ].merging(extra) { _, new in new }, logPath: directory + "/\(name).log")
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
