import Foundation
import HeraldCore
import HeraldRuntime
import HeraldTestSupport
import Testing

@Suite("Job status", .serialized)
struct JobStatusTests {
    /// A channel of 1,000 subscribers through the whole stack: 20 dead tokens (410), one APNs always refuses (500)
    /// and the rest delivered, slowly enough that the dispatcher is killed -9 mid-job and a new one resumes it.
    /// The producer's status ends `done` with the exact counts though some pushes went out twice.
    @Test("a job's status ends done with exact counts after a kill -9 mid-job; another app's key gets 403, an unknown job 404")
    func exactCountsAcrossAKill() async throws {
        let directory = try scratchDirectory("herald-job-status-")
        let apps = try TestApps(count: 2)
        defer { apps.remove() }
        let redisURL = try TestEnvironment.redisURL()
        let topics = FaultTopics(brokers: try TestEnvironment.kafkaBrokers())
        let count = 1_000, dead = 20, attempts = 3
        // 20 in flight at 100 ms: 200 pushes a second, so the job takes about 5 s and the kill lands inside it.
        let settings = ["HERALD_KAFKA_SESSION_TIMEOUT_SECONDS": "3", "HERALD_MAX_IN_FLIGHT_PUSHES": "20",
                        "HERALD_RETRY_MAX_ATTEMPTS": "\(attempts)", "HERALD_RETRY_INITIAL_DELAY_SECONDS": "0.2"]
        let rules: [JSONValue] = [
            .object(["tokenPrefix": .string("dead"), "status": .number(410), "reason": .string("Unregistered")]),
            .object(["tokenPrefix": .string("bad0"), "status": .number(500), "reason": .string("InternalServerError")]),
            .object(["delayMs": .number(100)]),
        ]
        let stack = try await FaultStack.start(apps: apps, redisURL: redisURL, topics: topics, directory: directory,
                                               channelCount: 1, perChannel: count, rules: rules,
                                               dispatcherName: "dispatcher-1", dispatcherExtra: settings) { _, slot in
            slot < dead ? "dead" : slot == dead ? "bad0" : ""
        }
        let (simulator, ingest, app, other) = (stack.simulator, stack.ingest, apps.apps[0], apps.apps[1])
        let channel = stack.audience.channels[0]

        let event = try await ingest.request("POST", "/v1/apps/\(app.id)/events", key: app.secretKey,
                                             json: #"{"channel": "\#(channel)", "alert": {"aps": {"alert": "sale"}}}"#)
        try #require(event.status == 202, "\(event.text)")
        let jobID = try #require(JSONValue(parsing: Array(event.text.utf8))?["jobId"]?.stringValue)
        let path = "/v1/apps/\(app.id)/jobs/\(jobID)"

        let first = try await status(ingest, path, key: app.secretKey)
        #expect(["queued", "sending"].contains(first["state"]?.stringValue), "\(first)")
        #expect(first["target"]?["channel"]?.stringValue == channel)
        #expect(first["acceptedAt"]?.stringValue != nil)
        #expect(try await ingest.request("GET", path, key: other.secretKey).status == 403, "another app's secret key")
        #expect(try await ingest.request("GET", "/v1/apps/\(other.id)/jobs/\(jobID)", key: other.secretKey).status == 404,
                "another app's jobs do not hold this one")
        #expect(try await ingest.request("GET", path, key: app.publicKey).status == 403, "a public key")
        let unknown = try await ingest.request("GET", "/v1/apps/\(app.id)/jobs/no-such-job", key: app.secretKey)
        #expect(unknown.status == 404 && unknown.text.contains("not_found"), "\(unknown.text)")

        try await eventually("a third of the job delivered", timeout: .seconds(60)) { simulator.acceptedCount() >= count / 3 }
        let sending = try await status(ingest, path, key: app.secretKey)
        #expect(sending["state"]?.stringValue == "sending", "\(sending)")
        await stack.dispatcher.child.crash()
        let beforeRestart = simulator.acceptedCount()
        #expect(beforeRestart < count - dead - 1, "the job finished before the kill; the test proves nothing")
        let dispatcher = try DispatcherProcess(apps: apps, simulator: simulator, topics: topics, redisURL: redisURL,
                                               directory: directory, name: "dispatcher-2", extra: settings)

        try await eventually("the job's status is done", timeout: .seconds(120)) {
            (try? await status(ingest, path, key: app.secretKey))?["state"]?.stringValue == "done"
        }
        let final = try await status(ingest, path, key: app.secretKey)
        let accepted = simulator.accepted().compactMap { $0["token"]?.stringValue }
        print("job status across a kill -9: \(beforeRestart) delivered before it, \(accepted.count - Set(accepted).count) sent twice; \(String(decoding: final.encoded(), as: UTF8.self))")
        #expect(Set(accepted).count == count - dead - 1, "every live token got its push")
        #expect(final["counts"]?["delivered"]?.numberValue == Double(count - dead - 1), "\(final)")
        #expect(final["counts"]?["tokensRemoved"]?.numberValue == Double(dead), "\(final)")
        #expect(final["counts"]?["deadLettered"]?.numberValue == 1, "\(final)")
        #expect(final["counts"]?["retried"]?.numberValue == Double(attempts - 1), "\(final)")
        for field in ["acceptedAt", "startedAt", "finishedAt"] {
            #expect(final[field]?.stringValue.flatMap(Timestamp.parse) != nil, "\(field): \(final)")
        }
        await dispatcher.child.stop()
        await ingest.child.stop()
        await simulator.child.stop()
        cleanUp(directory, keep: false)
    }

    private func status(_ ingest: IngestServer, _ path: String, key: String) async throws -> JSONValue {
        let response = try await ingest.request("GET", path, key: key)
        try #require(response.status == 200, "\(response.status) \(response.text)")
        return try #require(JSONValue(parsing: Array(response.text.utf8)))
    }
}
