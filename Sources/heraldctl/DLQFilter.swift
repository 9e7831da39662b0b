import Foundation
import HeraldCore
import HeraldRuntime

/// Which dead letters a `dlq list`, `dlq stats` or `replay` run is about: the filter flags, parsed and checked.
struct DLQFilter: Sendable {
    static let flagNames: Set<String> = ["app", "since", "until", "status", "reason", "push-type", "channel", "post"]

    var apps: Set<String> = []
    var since: Date?
    var until: Date?
    /// HTTP statuses; `nil` inside the set stands for "APNs never answered" (`--status none`).
    var statuses: Set<Int?> = []
    /// Lowercased, so `--reason baddevicetoken` matches `BadDeviceToken`.
    var reasons: Set<String> = []
    var pushTypes: Set<String> = []
    var channel: String?
    var post: String?
    /// The flags exactly as given (sorted), for naming a replay: the same command line is the same replay even
    /// when a relative `--since 2h` resolves to another time.
    let canonical: String

    init(_ flags: Flags, now: Date = Date()) throws {
        var parts: [String] = []
        for name in Self.flagNames.sorted() {
            if let value = flags[name] { parts.append("\(name)=\(value)") }
        }
        canonical = parts.joined(separator: "\n")

        apps = try Self.list(flags["app"], flag: "app")
        since = try flags["since"].map { try Self.time($0, flag: "--since", now: now) }
        until = try flags["until"].map { try Self.time($0, flag: "--until", now: now) }
        if let since, let until, since >= until {
            throw ConfigurationError("--since", "must be before --until (\(Timestamp.rfc3339(since)) ≥ \(Timestamp.rfc3339(until)))")
        }
        for value in try Self.list(flags["status"], flag: "status") {
            if value.lowercased() == "none" {
                statuses.insert(nil)
            } else if let status = Int(value), (100...599).contains(status) {
                statuses.insert(status)
            } else {
                throw ConfigurationError("--status", "expected HTTP statuses such as 410,503 or none (no answer from APNs), got \"\(value)\"")
            }
        }
        reasons = Set(try Self.list(flags["reason"], flag: "reason").map { $0.lowercased() })
        for value in try Self.list(flags["push-type"], flag: "push-type") {
            guard APNsPushType(rawValue: value) != nil else {
                throw ConfigurationError("--push-type", "unknown push type \"\(value)\"; one of "
                                         + APNsPushType.allCases.map(\.rawValue).joined(separator: ", "))
            }
            pushTypes.insert(value)
        }
        channel = flags["channel"]
        if let channel { try Self.check { () throws(ValidationError) in try Channel.validate(channel, field: "--channel") } }
        post = flags["post"]
        if let post { try Self.check { () throws(ValidationError) in try PostIDHash.validate(post, field: "--post") } }
    }

    /// Whether a dead letter written at `time` (its record timestamp) matches every filter.
    func matches(_ letter: DeadLetter, at time: Date?) -> Bool {
        if let since, let time, Self.milliseconds(time) < Self.milliseconds(since) { return false }
        if let until, let time, Self.milliseconds(time) >= Self.milliseconds(until) { return false }
        if !apps.isEmpty, !apps.contains(letter.appId) { return false }
        if !statuses.isEmpty, !statuses.contains(letter.status) { return false }
        if !reasons.isEmpty, !reasons.contains(letter.reason.lowercased()) { return false }
        if !pushTypes.isEmpty, !pushTypes.contains(letter.effectivePushType ?? "") { return false }
        // A replayed job is a device job: its dead letters match by the channel or post it first went out for.
        if let channel, letter.originalChannel != channel { return false }
        if let post, letter.originalPost != post { return false }
        return true
    }

    /// Record times are whole milliseconds; compared as such, a time printed by `dlq stats` selects its record
    /// whatever the `Double` rounding of either side.
    static func milliseconds(_ date: Date) -> Int64 { Int64((date.timeIntervalSince1970 * 1000).rounded()) }

    /// A comma-separated filter; given but empty (`--app "$UNSET"`) is an error, not "no filter", which would
    /// match every app's letters.
    private static func list(_ value: String?, flag: String) throws(ConfigurationError) -> Set<String> {
        guard let value else { return [] }
        let items = Set(value.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty })
        guard !items.isEmpty else { throw ConfigurationError("--\(flag)", "is empty; leave it out to match every value") }
        return items
    }

    private static func check(_ body: () throws(ValidationError) -> Void) throws {
        do { try body() } catch { throw ConfigurationError(error.field ?? "filter", error.message) }
    }

    /// A time: a duration ago (`90s`, `30m`, `2h`, `1d12h`, `1w`), an RFC 3339 time, or a UTC date.
    static func time(_ text: String, flag: String, now: Date) throws -> Date {
        let units: [Character: Double] = ["s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800]
        var seconds = 0.0, digits = "", sawUnit = false, relative = true
        for character in text {
            if character.isASCII, character.isNumber {
                digits.append(character)
            } else if let unit = units[character], let value = Double(digits) {
                seconds += value * unit
                digits = ""
                sawUnit = true
            } else {
                relative = false
                break
            }
        }
        if relative, sawUnit, digits.isEmpty { return now.addingTimeInterval(-seconds) }
        if let date = Timestamp.parse(text) { return date }
        if let date = try? Date(text + "T00:00:00Z", strategy: .iso8601) { return date }
        throw ConfigurationError(flag, "expected a time: a duration ago such as 2h, 30m or 1d12h, an RFC 3339 time such "
                                 + "as 2024-05-01T10:00:00Z, or a date such as 2024-05-01; got \"\(text)\"")
    }
}

/// A push token is a credential: output shows its first 8 characters only.
func maskedToken(_ token: String?) -> String {
    guard let token, !token.isEmpty else { return "-" }
    return token.count <= 8 ? token : token.prefix(8) + "…"
}
