import Foundation
import HeraldCore
import HeraldCrypto
import HeraldRuntime
import HeraldTestSupport
import Testing

@Suite("heraldctl dlq list / stats", .serialized)
struct DLQCommandTests {
    @Test("list shows each matching dead letter with its reason; filters select the right subset")
    func listAndFilters() async throws {
        let harness = try await CtlHarness.make()
        defer { Task { await harness.close() } }
        let other = "other" + SecureRandom.hex(4)
        let post = SecureRandom.hex(16)
        let letters = [
            harness.deadLetter(reason: "ServiceUnavailable", status: 503),
            harness.deadLetter(reason: "ServiceUnavailable", status: 503, pushType: "background"),
            harness.deadLetter(reason: "BadTopic", status: 400, channel: "orders"),
            harness.deadLetter(reason: "timeout", status: nil, post: post),
            harness.deadLetter(app: other, reason: "TooManyRequests", status: 429),
            harness.deadLetter(token: nil, reason: "invalid_job", status: nil),
        ]
        try validateAgainstSchema(letters.map { $0.encoded() }, schema: "dead-letter.schema.json")
        try await harness.publish(letters)

        let table = try await harness.heraldctl(["dlq", "list"])
        #expect(table.status == 0, "\(table.stderr)")
        #expect(table.stdout.contains("REASON"))
        #expect(table.stdout.contains("6 of 6 dead letters in \(harness.dlqTopic) matched"))
        #expect(table.stdout.contains("BadTopic"))
        for letter in letters {
            guard let token = letter.deviceToken else { continue }
            #expect(!table.stdout.contains(token), "tokens are credentials: only a prefix is shown")
            #expect(table.stdout.contains(String(token.prefix(8)) + "…"))
        }

        func listed(_ filters: [String]) async throws -> [JSONValue] {
            let result = try await harness.heraldctl(["dlq", "list", "--json"] + filters)
            #expect(result.status == 0, "\(filters): \(result.stderr)")
            return try result.json()["deadLetters"]?.arrayValue ?? []
        }
        func reasons(_ filters: [String]) async throws -> [String] {
            try await listed(filters).compactMap { $0["reason"]?.stringValue }.sorted()
        }
        #expect(try await reasons(["--app", harness.app]) == ["BadTopic", "ServiceUnavailable", "ServiceUnavailable",
                                                              "invalid_job", "timeout"])
        #expect(try await reasons(["--app", other]) == ["TooManyRequests"])
        #expect(try await reasons(["--reason", "serviceunavailable,badtopic"]) == ["BadTopic", "ServiceUnavailable",
                                                                                  "ServiceUnavailable"])
        #expect(try await reasons(["--status", "none"]) == ["invalid_job", "timeout"])
        #expect(try await reasons(["--status", "429,400"]) == ["BadTopic", "TooManyRequests"])
        #expect(try await reasons(["--push-type", "background"]) == ["ServiceUnavailable"])
        #expect(try await reasons(["--channel", "orders"]) == ["BadTopic"])
        #expect(try await reasons(["--post", post]) == ["timeout"])
        #expect(try await reasons(["--app", harness.app, "--status", "503", "--push-type", "alert"]) == ["ServiceUnavailable"])

        let one = try #require(try await listed(["--channel", "orders"]).first)
        #expect(one["appId"]?.stringValue == harness.app)
        #expect(one["status"]?.numberValue == 400)
        #expect(one["attempts"]?.numberValue == 5)
        #expect(one["pushType"]?.stringValue == "alert")
        #expect(one["target"]?["kind"]?.stringValue == "channel")
        #expect(one["target"]?["channel"]?.stringValue == "orders")
        #expect(one["partition"]?.numberValue != nil && one["offset"]?.numberValue != nil)
        #expect(one["jobId"]?.stringValue == letters[2].jobId)
        #expect(one["token"]?.stringValue == String(letters[2].deviceToken!.prefix(8)) + "…")

        let limited = try await harness.heraldctl(["dlq", "list", "--json", "--limit", "2"])
        let document = try limited.json()
        #expect(document["deadLetters"]?.arrayValue?.count == 2)
        #expect(document["matched"]?.numberValue == 6)
        #expect(document["shown"]?.numberValue == 2)
        #expect(document["scanned"]?.numberValue == 6)
        #expect(document["byReason"]?["ServiceUnavailable"]?.numberValue == 2)
        #expect(document["bySignature"] == .object(["signed": .number(6)]))
        #expect(one["signed"] == .bool(true))

        // A letter the deployment's dispatchers did not sign (another secret, or none) is shown as such: a replay
        // skips it.
        let forged = "forged" + SecureRandom.hex(4)
        try await harness.publish([harness.deadLetter(app: forged, reason: "BadDeviceToken", status: 400)], signed: false)
        try await harness.publish([harness.deadLetter(app: forged, reason: "BadDeviceToken", status: 400)],
                                  secret: try SharedSecret(bytes: SecureRandom.bytes(32)))
        let forgedRows = try await listed(["--app", forged])
        #expect(forgedRows.count == 2 && forgedRows.allSatisfy { $0["signed"] == .bool(false) }, "\(forgedRows)")
        let forgedText = try await harness.heraldctl(["dlq", "list", "--app", forged])
        #expect(forgedText.stdout.contains("2 not signed by this deployment's dispatchers"), "\(forgedText.stdout)")
        let mixed = try await harness.heraldctl(["dlq", "stats", "--json"]).json()
        #expect(mixed["bySignature"] == .object(["signed": .number(6), "unsigned": .number(2)]), "\(mixed)")
        // Without the secret nothing is said about signatures.
        let unknown = try await harness.heraldctl(["dlq", "stats", "--json"],
                                                  environment: ["HERALD_JOB_SIGNING_SECRET_FILE": ""]).json()
        #expect(unknown["bySignature"] == nil && unknown["matched"]?.numberValue == 8, "\(unknown)")
    }

    @Test("what a record says cannot steer the terminal: control and format characters are printed escaped")
    func controlCharactersAreEscaped() async throws {
        let harness = try await CtlHarness.make()
        defer { Task { await harness.close() } }
        let hostile = "Evil\u{1b}[2J\u{07}\u{202e}Topic"
        try await harness.publish([harness.deadLetter(reason: hostile, status: 400)])
        for arguments in [["dlq", "list"], ["dlq", "stats"]] {
            let result = try await harness.heraldctl(arguments)
            #expect(result.status == 0, "\(result.stderr)")
            #expect(!result.stdout.unicodeScalars.contains { $0 == "\u{1b}" || $0 == "\u{07}" || $0 == "\u{202e}" },
                    "\(arguments): raw control characters printed")
            #expect(result.stdout.contains(#"Evil\u{1b}[2J\u{7}\u{202e}Topic"#), "\(arguments): \(result.stdout)")
        }
    }

    @Test("stats counts by reason, status, app and push type")
    func stats() async throws {
        let harness = try await CtlHarness.make()
        defer { Task { await harness.close() } }
        try await harness.publish([
            harness.deadLetter(reason: "ServiceUnavailable", status: 503),
            harness.deadLetter(reason: "ServiceUnavailable", status: 503),
            harness.deadLetter(reason: "Unregistered", status: 410, pushType: "liveactivity"),
            harness.deadLetter(reason: "connection_failed", status: nil),
        ])
        let result = try await harness.heraldctl(["dlq", "stats", "--json"])
        #expect(result.status == 0, "\(result.stderr)")
        let stats = try result.json()
        #expect(stats["matched"]?.numberValue == 4)
        #expect(stats["byReason"] == .object(["ServiceUnavailable": .number(2), "Unregistered": .number(1),
                                              "connection_failed": .number(1)]))
        #expect(stats["byStatus"] == .object(["503": .number(2), "410": .number(1), "none": .number(1)]))
        #expect(stats["byApp"] == .object([harness.app: .number(4)]))
        #expect(stats["byPushType"] == .object(["alert": .number(3), "liveactivity": .number(1)]))
        // The span it prints, pasted back, selects the same dead letters (--until is exclusive).
        let first = try #require(stats["first"]?.stringValue), until = try #require(stats["until"]?.stringValue)
        let again = try await harness.heraldctl(["dlq", "stats", "--json", "--since", first, "--until", until]).json()
        #expect(again["matched"]?.numberValue == 4, "--since \(first) --until \(until): \(again)")
        let last = try #require(stats["last"]?.stringValue)
        let before = try await harness.heraldctl(["dlq", "stats", "--json", "--since", first, "--until", last]).json()
        #expect((before["matched"]?.numberValue ?? 0) < 4, "--until \(last) leaves the newest out")

        let text = try await harness.heraldctl(["dlq", "stats", "--reason", "ServiceUnavailable"])
        #expect(text.status == 0)
        #expect(text.stdout.contains("2 of 4 dead letters"))
        #expect(text.stdout.contains("by reason:"))
        #expect(text.stdout.contains("selects them again"), "\(text.stdout)")
    }

    @Test("--since and --until select by the time a dead letter was written (offsets-for-times)")
    func timeWindow() async throws {
        let harness = try await CtlHarness.make(partitions: 1)
        defer { Task { await harness.close() } }
        try await harness.publish((0..<3).map { _ in harness.deadLetter(reason: "early") })
        try await Task.sleep(for: .milliseconds(100))
        let cut = Timestamp.rfc3339(Date())
        try await Task.sleep(for: .milliseconds(100))
        try await harness.publish((0..<2).map { _ in harness.deadLetter(reason: "late") })

        let since = try await harness.heraldctl(["dlq", "list", "--json", "--since", cut]).json()
        #expect(since["matched"]?.numberValue == 2)
        #expect(since["byReason"] == .object(["late": .number(2)]))
        #expect(since["scanned"]?.numberValue == 2, "reading starts at the first record after --since")
        let until = try await harness.heraldctl(["dlq", "list", "--json", "--until", cut]).json()
        #expect(until["byReason"] == .object(["early": .number(3)]))
        let relative = try await harness.heraldctl(["dlq", "list", "--json", "--since", "1h"]).json()
        #expect(relative["matched"]?.numberValue == 5)
        let none = try await harness.heraldctl(["dlq", "list", "--json", "--until", "1h"]).json()
        #expect(none["matched"]?.numberValue == 0)
    }

    @Test("bad filters exit 2 with what to write; a missing topic or an unreachable broker exit 1 with what to do")
    func errors() async throws {
        let harness = try await CtlHarness.make()
        defer { Task { await harness.close() } }
        let badTime = try await harness.heraldctl(["dlq", "list", "--since", "yesterday"])
        #expect(badTime.status == 2)
        #expect(badTime.stderr.contains("--since") && badTime.stderr.contains("2h"))
        let badStatus = try await harness.heraldctl(["dlq", "stats", "--status", "gone"])
        #expect(badStatus.status == 2)
        #expect(badStatus.stderr.contains("--status"))
        let badPushType = try await harness.heraldctl(["dlq", "list", "--push-type", "loud"])
        #expect(badPushType.status == 2)
        #expect(badPushType.stderr.contains("liveactivity"))
        let backwards = try await harness.heraldctl(["dlq", "list", "--since", "1h", "--until", "2h"])
        #expect(backwards.status == 2)
        let unknown = try await harness.heraldctl(["dlq", "list", "--colour", "red"])
        #expect(unknown.status == 2)

        let missing = try await harness.heraldctl(["dlq", "list"], environment: ["HERALD_TOPIC_DLQ": "herald.dlq.missing-" + SecureRandom.hex(4)])
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("does not exist") && missing.stderr.contains("HERALD_TOPIC_DLQ"))
        let unreachable = try await harness.heraldctl(["dlq", "list"], environment: ["HERALD_KAFKA_BROKERS": "127.0.0.1:1"])
        #expect(unreachable.status == 1)
        #expect(unreachable.stderr.contains("cannot reach Kafka at 127.0.0.1:1"))
        #expect(unreachable.stderr.contains("HERALD_KAFKA_BROKERS"))

        let help = try await harness.heraldctl(["dlq", "--help"])
        #expect(help.status == 0)
        #expect(help.stdout.contains("Examples:"))
    }
}
