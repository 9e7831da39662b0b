import Foundation
import HeraldCore
import HeraldRuntime

/// `heraldctl dlq list` and `heraldctl dlq stats`: what failed, and why, without changing anything.
enum DLQCommand {
    static let usage = """
        heraldctl dlq — inspect failed deliveries on the dead-letter topic (HERALD_TOPIC_DLQ).

        Usage:
          heraldctl dlq list [FILTERS] [--limit N] [--json]
              One line per matching dead letter (at most --limit, default 100, 0 for all), then the number that
              matched and counts by reason. Tokens are shown by their first 8 characters only.
          heraldctl dlq stats [FILTERS] [--json]
              Counts of the matching dead letters by reason, status, app and push type, with the time span.

        Filters (all optional, combined with AND; lists are comma-separated and match any of their values):
          --app ID[,ID]        the job's app
          --since TIME         dead-lettered at or after TIME; the topic is read from there (offsets-for-times)
          --until TIME         dead-lettered before TIME
                               TIME: a duration ago (90s, 30m, 2h, 1d12h, 1w), an RFC 3339 time
                               (2024-05-01T10:00:00Z), or a UTC date (2024-05-01)
          --status LIST        APNs' HTTP status (410,429,503), or none when APNs never answered
          --reason LIST        APNs' or Herald's reason, any case (BadDeviceToken,ServiceUnavailable,timeout)
          --push-type LIST     alert, background, liveactivity, voip, …
          --channel NAME       dead letters of jobs sent to this channel
          --post HASH          dead letters of jobs sent to this Live Activity post

        The topic is read up to where it ended when the command started; it is never held in memory whole.

        With HERALD_JOB_SIGNING_SECRET_FILE set (the deployment's job-signing secret), both also say which dead
        letters this deployment's dispatchers signed: `heraldctl replay` sends only those unless
        --include-unsigned.

        --json: list prints {"deadLetters": [...], "matched": n, "shown": n, "scanned": n, "byReason": {...}};
        stats prints {"matched": n, "scanned": n, "unreadable": n, "first": time, "last": time, "until": last + 1 ms,
        "byReason": {...}, "byStatus": {...}, "byApp": {...}, "byPushType": {...}}. With the secret, each listed
        dead letter has "signed": true|false, and both documents "bySignature": {"signed": n, "unsigned": n}.

        Examples:
          heraldctl dlq list --since 2h
          heraldctl dlq list --app shop --reason ServiceUnavailable,timeout --since 2024-05-01T08:00:00Z --until 2024-05-01T09:00:00Z
          heraldctl dlq stats --since 1d --json | jq .byReason
          heraldctl dlq list --channel order-1234 --status none --limit 0 --json > failed.json

        Environment: HERALD_KAFKA_BROKERS [127.0.0.1:9092], HERALD_TOPIC_DLQ [herald.dlq],
        HERALD_JOB_SIGNING_SECRET_FILE (optional).
        Exit codes: 0 done (also when nothing matched), 1 failed (Kafka unreachable, topic missing: the reason is
        printed), 2 bad usage or filter.
        """

    static func list(_ flags: Flags) async throws {
        let filter = try DLQFilter(flags)
        let limit = try flags.int("limit", default: 100, range: 0...Int.max)
        let json = flags.has("json")
        let secret = try signingSecret()
        let connections = try Connections()
        let reader = try await DLQReader.open(connections, filter: filter)
        var counts = Counts()
        var shown = 0
        let out = Output()
        if json {
            out.write("{\"deadLetters\":[")
        } else {
            out.write(Row.header + "\n")
        }
        let scanned = try await scan(reader, filter, connections, secret: secret, counts: &counts) { entry, letter, signed in
            guard limit == 0 || shown < limit else { return }
            if json {
                let row = Row.json(entry, letter, signed: signed)
                out.write((shown == 0 ? "\n" : ",\n") + String(decoding: row.encoded(), as: UTF8.self))
            } else {
                out.write(Row.text(entry, letter).escapingControls + "\n")
            }
            shown += 1
        }
        if json {
            var summary = "\n],\"matched\":\(counts.matched),\"shown\":\(shown),\"scanned\":\(scanned),\"byReason\":"
            summary += String(decoding: JSONValue.object(counts.byReason.mapValues { .number(Double($0)) }).encoded(), as: UTF8.self)
            if secret != nil {
                summary += ",\"bySignature\":"
                    + String(decoding: JSONValue.object(counts.bySignature.mapValues { .number(Double($0)) }).encoded(), as: UTF8.self)
            }
            out.write(summary + "}\n")
        } else {
            var footer = "\n\(counts.matched) of \(scanned) dead letters in \(connections.dlqTopic) matched"
            if shown < counts.matched { footer += " (\(shown) shown; --limit 0 shows all)" }
            if counts.unreadable > 0 { footer += "; \(counts.unreadable) records were not readable dead letters" }
            if let unsigned = counts.bySignature["unsigned"] {
                footer += "; \(unsigned) not signed by this deployment's dispatchers: a replay skips them "
                    + "(--include-unsigned sends them)"
            }
            out.write(footer + "\n")
            if !counts.byReason.isEmpty {
                out.write("by reason:\n" + table(counts.byReason) + "\n")
            }
        }
        out.flush()
    }

    /// Reads the whole topic once through `reader` and closes it: counts the records that match `filter` (and
    /// those that are not readable dead letters) and hands each match to `each`, with whether it carries a
    /// signature by `secret` (nil without one). Returns how many records were scanned; a failure comes back
    /// explained for the operator.
    private static func scan(_ reader: DLQReader, _ filter: DLQFilter, _ connections: Connections, secret: SharedSecret?,
                             counts: inout Counts,
                             each: (DLQEntry, DeadLetter, Bool?) -> Void = { _, _, _ in }) async throws -> Int {
        do {
            try await reader.read { entries in
                for entry in entries {
                    guard let letter = entry.letter else {
                        counts.unreadable += 1
                        continue
                    }
                    guard filter.matches(letter, at: entry.time) else { continue }
                    let signed = secret.map { JobSignature.verifies(entry.headers, record: entry.record, secrets: [$0]) }
                    counts.add(letter, at: entry.time, signed: signed)
                    each(entry, letter, signed)
                }
                return true
            }
        } catch {
            await reader.close()
            throw connections.explain(error, topic: connections.dlqTopic)
        }
        await reader.close()
        return reader.scanned.current
    }

    static func stats(_ flags: Flags) async throws {
        let filter = try DLQFilter(flags)
        let secret = try signingSecret()
        let connections = try Connections()
        let reader = try await DLQReader.open(connections, filter: filter)
        var counts = Counts()
        let scanned = try await scan(reader, filter, connections, secret: secret, counts: &counts)
        let out = Output()
        if flags.has("json") {
            func object(_ counts: [String: Int]) -> JSONValue { .object(counts.mapValues { .number(Double($0)) }) }
            var document: [String: JSONValue] = [
                "matched": .number(Double(counts.matched)), "scanned": .number(Double(scanned)),
                "unreadable": .number(Double(counts.unreadable)),
                "first": counts.first.map { .string(Self.time($0)) } ?? .null,
                "last": counts.last.map { .string(Self.time($0)) } ?? .null,
                // What --until takes to include `last` (it is exclusive).
                "until": counts.last.map { .string(Self.time($0, plus: 1)) } ?? .null,
                "byReason": object(counts.byReason), "byStatus": object(counts.byStatus),
                "byApp": object(counts.byApp), "byPushType": object(counts.byPushType),
            ]
            if secret != nil { document["bySignature"] = object(counts.bySignature) }
            out.write(String(decoding: JSONValue.object(document).encoded(), as: UTF8.self) + "\n")
        } else {
            var text = "\(counts.matched) of \(scanned) dead letters in \(connections.dlqTopic) matched"
            if let first = counts.first, let last = counts.last {
                text += ", dead-lettered from \(Self.time(first)) to \(Self.time(last))"
                    + " (--since \(Self.time(first)) --until \(Self.time(last, plus: 1)) selects them again)"
            }
            if counts.unreadable > 0 { text += "; \(counts.unreadable) records were not readable dead letters" }
            text += "\n"
            for (title, values) in [("by reason", counts.byReason), ("by status", counts.byStatus),
                                    ("by app", counts.byApp), ("by push type", counts.byPushType),
                                    ("by signature (a replay sends only signed ones)", counts.bySignature)]
                where !values.isEmpty {
                text += "\n\(title):\n" + table(values) + "\n"
            }
            out.write(text)
        }
        out.flush()
    }

    /// The deployment's job-signing secret, when HERALD_JOB_SIGNING_SECRET_FILE names one.
    private static func signingSecret() throws -> SharedSecret? {
        guard let path = EnvironmentReader().optionalString("HERALD_JOB_SIGNING_SECRET_FILE") else { return nil }
        do { return try SharedSecret(path: path) } catch {
            throw ConfigurationError("HERALD_JOB_SIGNING_SECRET_FILE", error.message)
        }
    }

    /// A record time as `--since`/`--until` take it, `plus` milliseconds later.
    static func time(_ date: Date, plus: Int64 = 0) -> String {
        Timestamp.rfc3339(milliseconds: DLQFilter.milliseconds(date) + plus)
    }

    /// Counts, largest first, as aligned lines (the numbers right-aligned).
    static func table(_ counts: [String: Int]) -> String {
        let rows = counts.map { (key: $0.key.escapingControls, value: $0.value) }
            .sorted { ($0.value, $1.key) > ($1.value, $0.key) }
        let width = rows.map(\.key.count).max() ?? 0
        let digits = rows.map { String($0.value).count }.max() ?? 0
        return rows.map { "  " + $0.key.padding(toLength: width, withPad: " ", startingAt: 0) + "  "
            + String($0.value).leftPadded(digits) }
            .joined(separator: "\n")
    }
}

/// Tallies of matching dead letters.
struct Counts {
    var matched = 0
    var unreadable = 0
    var byReason: [String: Int] = [:]
    var byStatus: [String: Int] = [:]
    var byApp: [String: Int] = [:]
    var byPushType: [String: Int] = [:]
    /// "signed" and "unsigned", when the secret is known.
    var bySignature: [String: Int] = [:]
    var first: Date?
    var last: Date?

    mutating func add(_ letter: DeadLetter, at time: Date?, signed: Bool?) {
        matched += 1
        if let signed { bySignature[signed ? "signed" : "unsigned", default: 0] += 1 }
        byReason[letter.reason, default: 0] += 1
        byStatus[letter.status.map(String.init) ?? "none", default: 0] += 1
        byApp[letter.appId, default: 0] += 1
        byPushType[letter.effectivePushType ?? "none", default: 0] += 1
        if let time {
            first = min(first ?? time, time)
            last = max(last ?? time, time)
        }
    }
}

/// How `dlq list` shows one dead letter.
enum Row {
    static let header = ["TIME".padding(24), "PARTITION:OFFSET".padding(17), "APP".padding(12), "STATUS".padding(6),
                         "REASON".padding(26), "ATTEMPTS".padding(8), "PUSH TYPE".padding(12), "TOKEN".padding(10),
                         "TARGET"].joined(separator: " ")

    static func text(_ entry: DLQEntry, _ letter: DeadLetter) -> String {
        [letter.deadLetteredAt.padding(24), "\(entry.partition):\(entry.offset)".padding(17), letter.appId.padding(12),
         (letter.status.map(String.init) ?? "-").padding(6), letter.reason.padding(26), String(letter.attempts).padding(8),
         (letter.effectivePushType ?? "-").padding(12), maskedToken(letter.deviceToken).padding(10),
         letter.targetDescription].joined(separator: " ")
    }

    static func json(_ entry: DLQEntry, _ letter: DeadLetter, signed: Bool?) -> JSONValue {
        var object: [String: JSONValue] = [
            "partition": .number(Double(entry.partition)), "offset": .number(Double(entry.offset)),
            "appId": .string(letter.appId), "reason": .string(letter.reason),
            "attempts": .number(Double(letter.attempts)), "deadLetteredAt": .string(letter.deadLetteredAt),
            "status": letter.status.map { .number(Double($0)) } ?? .null,
            "token": .string(maskedToken(letter.deviceToken)),
        ]
        if let signed { object["signed"] = .bool(signed) }
        if let jobId = letter.jobId ?? letter.job?.id { object["jobId"] = .string(jobId) }
        if let pushType = letter.effectivePushType { object["pushType"] = .string(pushType) }
        if let tokenType = letter.tokenType { object["tokenType"] = .string(tokenType.rawValue) }
        if let environment = letter.environment { object["environment"] = .string(environment.rawValue) }
        if let topic = letter.topic { object["topic"] = .string(topic) }
        if let apnsId = letter.apnsId { object["apnsId"] = .string(apnsId) }
        if let uniqueId = letter.apnsUniqueId { object["apnsUniqueId"] = .string(uniqueId) }
        if let target = letter.job?.target {
            var described: [String: JSONValue] = ["kind": .string(target.kind.rawValue)]
            if let channel = target.channel { described["channel"] = .string(channel) }
            if let post = target.postIdHash { described["postIdHash"] = .string(post) }
            object["target"] = .object(described)
        }
        if let first = letter.firstAttemptAt { object["firstAttemptAt"] = .string(first) }
        if let last = letter.lastAttemptAt { object["lastAttemptAt"] = .string(last) }
        return .object(object)
    }
}

extension String {
    /// Control and format characters (escape sequences, bidi overrides, zero-width marks) written as `\u{…}`:
    /// what a record says must not steer the operator's terminal.
    var escapingControls: String {
        guard unicodeScalars.contains(where: \.isControlOrFormat) else { return self }
        var escaped = String.UnicodeScalarView()
        for scalar in unicodeScalars {
            if scalar.isControlOrFormat {
                escaped.append(contentsOf: "\\u{\(String(scalar.value, radix: 16))}".unicodeScalars)
            } else {
                escaped.append(scalar)
            }
        }
        return String(escaped)
    }

    /// Left-aligned in `width` columns (longer text is kept whole: a table is read, not parsed).
    func padding(_ width: Int) -> String {
        count >= width ? self : self + String(repeating: " ", count: width - count)
    }
}

extension Unicode.Scalar {
    var isControlOrFormat: Bool {
        switch properties.generalCategory {
        case .control, .format: true
        default: false
        }
    }
}

/// Buffered standard output: rows are many and small.
final class Output {
    private var buffer: [UInt8] = []

    func write(_ text: String) {
        buffer.append(contentsOf: text.utf8)
        if buffer.count >= 64 * 1024 { flush() }
    }

    func flush() {
        guard !buffer.isEmpty else { return }
        FileHandle.standardOutput.write(Data(buffer))
        buffer.removeAll(keepingCapacity: true)
    }
}

extension DeadLetter {
    /// `apns-push-type` as sent, else what the job asked for, else what its token type implies.
    var effectivePushType: String? {
        if let pushType { return pushType }
        guard let job else { return nil }
        if job.target.kind != .device { return job.pushType }
        return job.resolvedPushType.rawValue
    }

    /// What the failed job was addressed to, for people: `channel:news`, `post:ab12…`, `device`, `broadcast`.
    var targetDescription: String {
        switch job?.target {
        case .channel(let name)?: "channel:" + name
        case .post(let hash)?: "post:" + hash
        case .device?: "device"
        case .broadcast?: "broadcast"
        case nil: "-"
        }
    }
}
