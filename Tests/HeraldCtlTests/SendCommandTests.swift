import Foundation
import HeraldCore
import HeraldCrypto
import HeraldRuntime
import HeraldStore
import HeraldTestSupport
import Testing

/// `heraldctl send` against herald-dispatcher and herald-apns-sim as processes: through Kafka (waiting for the job's
/// status), straight to APNs, and dry runs that send nothing.
@Suite("heraldctl send", .serialized)
struct SendCommandTests {
    @Test("through Kafka: waits until the job is done and prints its counts; a dead token among them exits 3")
    func throughKafka() async throws {
        let directory = try scratchDirectory("herald-send-")
        let apps = try TestApps()
        defer { apps.remove() }
        let harness = try await CtlHarness.make(partitions: 1, jobSigningSecretPath: apps.jobSigningSecretPath)
        defer { Task { await harness.close() } }
        let app = apps.apps[0]
        let channel = "order:\(SecureRandom.hex(4)):status"
        let live = [token(prefix: ""), token(prefix: "")], dead = token(prefix: "dead")
        let store = SubscriptionStore(redis: harness.redis)
        for token in live + [dead] {
            _ = try await store.upsert(app: app.id, SubscriptionInput(.object([
                "channel": .string(channel), "deviceToken": .string(token), "tokenType": .string("alert"),
            ])))
        }
        let simulator = try SimulatorProcess(apps: apps, directory: directory, rules: [
            .object(["tokenPrefix": .string("dead"), "status": .number(410), "reason": .string("Unregistered")]),
        ])
        try await simulator.waitUntilListening()
        let dispatcher = try DispatcherProcess(apps: apps, simulator: simulator, brokers: harness.brokers,
                                               jobsTopic: harness.jobsTopic, deadLetterTopic: harness.dlqTopic,
                                               group: "herald-dispatcher-" + SecureRandom.hex(5), directory: directory)
        try await dispatcher.waitForAssignment()

        // A dry run prints the signed record and publishes nothing.
        let dry = try await harness.heraldctl(["send", "--app", app.id, "--channel", channel, "--alert-title", "Dry",
                                               "--dry-run"])
        #expect(dry.status == 0, "\(dry.stderr)")
        let record = try dry.json()
        #expect(record["topic"]?.stringValue == harness.jobsTopic)
        #expect(record["key"]?.stringValue == "\(app.id)/\(channel)")
        #expect(record["headers"]?["herald-signature"]?.stringValue != nil)
        #expect(record["value"]?["alert"]?["aps"]?["alert"]?["title"]?.stringValue == "Dry")

        let sent = try await harness.heraldctl(["send", "--app", app.id, "--channel", channel, "--alert-title", "Sale",
                                                "--alert-body", "Today only", "--json"])
        #expect(sent.status == 3, "a token was removed: \(sent.stdout) \(sent.stderr)")
        let status = try sent.json()
        #expect(status["state"]?.stringValue == "done")
        #expect(status["counts"]?["delivered"]?.numberValue == 2 && status["counts"]?["tokensRemoved"]?.numberValue == 1,
                "\(status)")
        #expect(status["target"]?["channel"]?.stringValue == channel)
        let accepted = simulator.accepted()
        #expect(Set(accepted.compactMap { $0["token"]?.stringValue }) == Set(live), "the dry run sent nothing")
        #expect(accepted.allSatisfy { $0["payload"]?["aps"]?["alert"]?["body"]?.stringValue == "Today only" })

        let device = try await harness.heraldctl(["send", "--app", app.id, "--device-token", live[0],
                                                  "--alert-title", "Just you"])
        #expect(device.status == 0, "\(device.stderr)")
        #expect(device.stdout.contains("1 delivered, 0 tokens removed, 0 dead-lettered"), "\(device.stdout)")

        // Without a dispatcher the wait ends with the job's state and exit 1.
        await dispatcher.child.stop()
        let stalled = try await harness.heraldctl(["send", "--app", app.id, "--device-token", live[1],
                                                   "--alert-title", "Nobody home", "--timeout", "2"])
        #expect(stalled.status == 1 && stalled.stderr.contains("still queued"), "\(stalled.stderr)")
        await simulator.child.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    @Test("--direct prints Apple's answer with apns-id and apns-unique-id; --dry-run prints the request and sends nothing")
    func direct() async throws {
        let directory = try scratchDirectory("herald-send-direct-")
        let apps = try TestApps()
        defer { apps.remove() }
        let harness = try await CtlHarness.make(partitions: 1, jobSigningSecretPath: apps.jobSigningSecretPath)
        defer { Task { await harness.close() } }
        let app = apps.apps[0]
        let simulator = try SimulatorProcess(apps: apps, directory: directory, rules: [
            .object(["tokenPrefix": .string("dead"), "status": .number(410), "reason": .string("Unregistered")]),
            .object(["tokenPrefix": .string("5104"), "delayMs": .number(6000)]),
        ])
        try await simulator.waitUntilListening()
        let apns = ["HERALD_APPS_FILE": apps.path, "HERALD_APNS_PRODUCTION_URL": simulator.url,
                    "HERALD_APNS_SANDBOX_URL": simulator.url, "HERALD_APNS_CA_FILE": simulator.caFile]
        let live = token(prefix: ""), dead = token(prefix: "dead")

        let dry = try await harness.heraldctl(["send", "--app", app.id, "--device-token", live, "--environment", "sandbox",
                                               "--alert-title", "Hi", "--direct", "--dry-run"], environment: apns)
        #expect(dry.status == 0, "\(dry.stderr)")
        #expect(dry.stdout.contains(":path: /3/device/\(live)") && dry.stdout.contains("apns-topic: \(app.bundleID)")
                && dry.stdout.contains("apns-push-type: alert") && dry.stdout.contains("apns-id: "), "\(dry.stdout)")
        let bearer = try #require(dry.stdout.split(separator: "\n").first { $0.hasPrefix("authorization: bearer ") })
        #expect(bearer.count < 50, "the provider token is shortened: \(bearer)")
        #expect(dry.stdout.contains(#"{"aps":{"alert":{"title":"Hi"}}}"#))

        let sent = try await harness.heraldctl(["send", "--app", app.id, "--device-token", live, "--environment", "sandbox",
                                                "--alert-title", "Hi", "--direct", "--json"], environment: apns)
        #expect(sent.status == 0, "\(sent.stderr)")
        let answer = try sent.json()
        #expect(answer["status"]?.numberValue == 200)
        #expect(answer["apnsId"]?.stringValue.flatMap(UUID.init(uuidString:)) != nil, "\(answer)")
        #expect(answer["apnsUniqueId"]?.stringValue.flatMap(UUID.init(uuidString:)) != nil, "\(answer)")
        let accepted = simulator.accepted()
        #expect(accepted.count == 1 && accepted.first?["token"]?.stringValue == live, "only the real send arrived")

        let refused = try await harness.heraldctl(["send", "--app", app.id, "--device-token", dead, "--alert-title", "Hi",
                                                   "--direct"], environment: apns)
        #expect(refused.status == 1 && refused.stdout.contains("answered 410 Unregistered"), "\(refused.stdout)")

        // Usage errors exit 2 and send nothing.
        for bad in [["--channel", "c", "--alert-title", "x", "--direct"],
                    ["--channel", "c", "--device-token", live, "--alert-title", "x"],
                    ["--post", "p", "--alert-title", "x"],
                    ["--device-token", live],
                    ["--channel", "c", "--alert-title", "x", "--environment", "sandbox"]] {
            let usage = try await harness.heraldctl(["send", "--app", app.id] + bad, environment: apns)
            #expect(usage.status == 2, "\(bad): \(usage.stderr)")
        }
        #expect(simulator.accepted().count == 1)

        // --timeout bounds the wait for APNs' answer.
        let started = ContinuousClock.now
        let slow = try await harness.heraldctl(["send", "--app", app.id, "--device-token", token(prefix: "5104"),
                                                "--alert-title", "Hi", "--direct", "--timeout", "1"], environment: apns)
        #expect(slow.status == 1 && slow.stderr.contains("no answer from APNs"), "\(slow.stdout) \(slow.stderr)")
        #expect(ContinuousClock.now - started < .seconds(5), "answered by the 1 s timeout, not the 6 s delay")
        await simulator.child.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    private func token(prefix: String) -> String { prefix + SecureRandom.hex(32).dropFirst(prefix.count) }
}
