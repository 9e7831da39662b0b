import Foundation
import HeraldRuntime

/// A programmed failure. Request rules (with or without `tokenPrefix`) apply to requests that passed every
/// validation; the first rule that matches a request decides it. A connection rule (`goawayAfterStreams`)
/// applies to every connection.
///
/// Rules file: `{"rules": [ {...}, ... ]}` with these keys per rule:
/// - `tokenPrefix`: hex prefix of the device tokens the rule applies to (case-insensitive); absent = every token.
/// - `channelId`: the rule applies to broadcasts on this channel instead (only `status`, `reason`, `times`); rules
///   without it never apply to broadcasts.
/// - `times`: apply only to the first N matching requests of each token (counted since the rules were loaded).
/// - `status` + `reason`: answer with this status (400–599) and reason; for 410, `timestamp` (ms since the
///   epoch) defaults to the time of the request.
/// - `delayMs`: wait this long before answering (with `status`, or else the normal 200).
/// - `reset`: close the TCP connection without answering.
/// - `goawayAfterStreams`: send GOAWAY after this many requests on each connection (`goawayReason` is put in
///   the GOAWAY debug data as `{"reason": ...}`); later streams are refused and the connection is closed.
public struct SimulatorRule: Sendable, Equatable {
    public var tokenPrefix: String?
    public var channelID: String?
    public var times: Int?
    public var status: Int?
    public var reason: String?
    public var timestamp: Int64?
    public var delayMilliseconds: Int?
    public var reset: Bool
    public var goawayAfterStreams: Int?
    public var goawayReason: String?

    public init(tokenPrefix: String? = nil, channelID: String? = nil, times: Int? = nil, status: Int? = nil,
                reason: String? = nil, timestamp: Int64? = nil, delayMilliseconds: Int? = nil, reset: Bool = false,
                goawayAfterStreams: Int? = nil, goawayReason: String? = nil) {
        self.tokenPrefix = tokenPrefix?.lowercased()
        self.channelID = channelID
        self.times = times
        self.status = status
        self.reason = reason
        self.timestamp = timestamp
        self.delayMilliseconds = delayMilliseconds
        self.reset = reset
        self.goawayAfterStreams = goawayAfterStreams
        self.goawayReason = goawayReason
    }

    /// Answer `status`/`reason` to matching tokens (the first `times` attempts only, when given).
    public static func fail(tokenPrefix: String?, status: Int, reason: String, times: Int? = nil,
                            timestamp: Int64? = nil) -> SimulatorRule {
        SimulatorRule(tokenPrefix: tokenPrefix, times: times, status: status, reason: reason, timestamp: timestamp)
    }

    /// Delay the answer to matching tokens.
    public static func delay(tokenPrefix: String?, milliseconds: Int, times: Int? = nil) -> SimulatorRule {
        SimulatorRule(tokenPrefix: tokenPrefix, times: times, delayMilliseconds: milliseconds)
    }

    /// Close the connection when a matching token arrives.
    public static func resetConnection(tokenPrefix: String?, times: Int? = nil) -> SimulatorRule {
        SimulatorRule(tokenPrefix: tokenPrefix, times: times, reset: true)
    }

    /// GOAWAY after `streams` requests on every connection.
    public static func goaway(afterStreams streams: Int, reason: String? = nil) -> SimulatorRule {
        SimulatorRule(goawayAfterStreams: streams, goawayReason: reason)
    }

    var isConnectionRule: Bool { goawayAfterStreams != nil }

    /// Checks the combination of fields; the message names what is wrong.
    func validate() throws(ConfigurationError) {
        func fail(_ message: String) -> ConfigurationError { ConfigurationError("rules", message) }
        if let prefix = tokenPrefix, prefix.isEmpty || !prefix.utf8.allSatisfy(\.isHexDigit) {
            throw fail("tokenPrefix must be hex, got \"\(prefix)\"")
        }
        if let times, times < 1 { throw fail("times must be at least 1") }
        if let channelID {
            guard !channelID.isEmpty, tokenPrefix == nil, status != nil, delayMilliseconds == nil, !reset,
                  goawayAfterStreams == nil else {
                throw fail("a channelId rule takes only status, reason and times")
            }
        }
        if let goaway = goawayAfterStreams {
            guard goaway >= 1 else { throw fail("goawayAfterStreams must be at least 1") }
            guard tokenPrefix == nil, times == nil, status == nil, reason == nil, delayMilliseconds == nil, !reset else {
                throw fail("a goawayAfterStreams rule takes only goawayReason")
            }
            return
        }
        if goawayReason != nil { throw fail("goawayReason needs goawayAfterStreams") }
        if let status {
            guard (400...599).contains(status) else { throw fail("status must be 400...599, got \(status)") }
            guard let reason, !reason.isEmpty else { throw fail("status \(status) needs a reason") }
            if reset { throw fail("reset cannot be combined with status") }
        } else if reason != nil || timestamp != nil {
            throw fail("reason and timestamp need a status")
        }
        if timestamp != nil, status != 410 { throw fail("timestamp is only for status 410") }
        if let delay = delayMilliseconds {
            guard delay >= 0 else { throw fail("delayMs must not be negative") }
            if reset { throw fail("reset cannot be combined with delayMs") }
        }
        guard status != nil || delayMilliseconds != nil || reset else {
            throw fail("a rule needs status, delayMs, reset or goawayAfterStreams")
        }
    }

    private static let keys: Set<String> = ["tokenPrefix", "channelId", "times", "status", "reason", "timestamp", "delayMs",
                                            "reset", "goawayAfterStreams", "goawayReason"]

    /// Parses a rules document (`{"rules": [...]}`); unknown keys and bad combinations are errors.
    public static func parse(_ data: Data) throws(ConfigurationError) -> [SimulatorRule] {
        guard let document = try? JSONDecoder().decode(JSONValue.self, from: data),
              let list = document["rules"]?.arrayValue, document.objectValue?.count == 1 else {
            throw ConfigurationError("rules", "expected a JSON object {\"rules\": [...]}")
        }
        var rules: [SimulatorRule] = []
        for (index, entry) in list.enumerated() {
            guard let fields = entry.objectValue else { throw ConfigurationError("rules", "rule \(index) is not an object") }
            if let unknown = fields.keys.first(where: { !keys.contains($0) }) {
                throw ConfigurationError("rules", "rule \(index): unknown key \"\(unknown)\"")
            }
            func int(_ key: String) throws(ConfigurationError) -> Int? {
                guard let value = fields[key] else { return nil }
                guard let number = value.numberValue, number == number.rounded(), abs(number) < 9e15 else {
                    throw ConfigurationError("rules", "rule \(index): \(key) must be a whole number")
                }
                return Int(number)
            }
            func string(_ key: String) throws(ConfigurationError) -> String? {
                guard let value = fields[key] else { return nil }
                guard let text = value.stringValue else {
                    throw ConfigurationError("rules", "rule \(index): \(key) must be a string")
                }
                return text
            }
            var reset = false
            if let value = fields["reset"] {
                guard let flag = value.boolValue else { throw ConfigurationError("rules", "rule \(index): reset must be true or false") }
                reset = flag
            }
            let rule = SimulatorRule(
                tokenPrefix: try string("tokenPrefix"), channelID: try string("channelId"), times: try int("times"), status: try int("status"),
                reason: try string("reason"), timestamp: try int("timestamp").map(Int64.init),
                delayMilliseconds: try int("delayMs"), reset: reset, goawayAfterStreams: try int("goawayAfterStreams"),
                goawayReason: try string("goawayReason"))
            do { try rule.validate() } catch {
                throw ConfigurationError("rules", "rule \(index): \(error.message)")
            }
            rules.append(rule)
        }
        return rules
    }
}

/// What a request rule decided.
struct RuleDecision {
    var rejection: APNsRejection?
    var delay: Duration?
    var reset: Bool
}

/// The current rules, their per-token attempt counts, and the rules file they come from (re-read when its
/// modification time, size or inode changes; checked at most every 100 ms).
final class RuleBook: Sendable {
    private struct FileStamp: Equatable {
        var modified: timespec.Stamp
        var size: Int64
        var inode: UInt64
    }

    private struct State {
        var rules: [SimulatorRule] = []
        var attempts: [[String: Int]] = []
        var stamp: FileStamp?
        var lastCheck: ContinuousClock.Instant?
    }

    private let path: String?
    private let logger: Logger
    private let state = Lock(State())
    private static let checkInterval = Duration.milliseconds(100)

    init(path: String?, rules: [SimulatorRule], logger: Logger) {
        self.path = path
        self.logger = logger
        state.withLock { s in
            s.rules = rules
            s.attempts = Array(repeating: [:], count: rules.count)
        }
    }

    /// Loads the rules file now; throws when it is missing or invalid (used at start-up).
    func loadFile() throws(ConfigurationError) {
        guard let path else { return }
        let (rules, stamp) = try Self.read(path)
        state.withLock { s in
            s.rules = rules
            s.attempts = Array(repeating: [:], count: rules.count)
            s.stamp = stamp
            s.lastCheck = .now
        }
    }

    /// Replaces the rules (and their attempt counts).
    func replace(_ rules: [SimulatorRule]) {
        state.withLock { s in
            s.rules = rules
            s.attempts = Array(repeating: [:], count: rules.count)
        }
    }

    var rules: [SimulatorRule] { state.withLock { $0.rules } }

    /// The decision for a valid request to `token`, counting the attempt; nil when no rule matches.
    func decide(token: String, now: Double) -> RuleDecision? {
        refreshIfDue()
        return state.withLock { s -> RuleDecision? in
            for index in s.rules.indices {
                let rule = s.rules[index]
                if rule.isConnectionRule || rule.channelID != nil { continue }
                if let prefix = rule.tokenPrefix, !token.hasPrefix(prefix) { continue }
                if let times = rule.times {
                    let used = s.attempts[index][token, default: 0]
                    if used >= times { continue }
                    s.attempts[index][token] = used + 1
                }
                var rejection: APNsRejection?
                if let status = rule.status, let reason = rule.reason {
                    let timestamp = status == 410 ? (rule.timestamp ?? Int64(now * 1000)) : nil
                    rejection = APNsRejection(status, reason, timestamp: timestamp)
                }
                return RuleDecision(rejection: rejection, delay: rule.delayMilliseconds.map { .milliseconds($0) },
                                    reset: rule.reset)
            }
            return nil
        }
    }

    /// The answer a `channelId` rule programs for a broadcast on `channelID`, if any.
    func decide(channelID: String, now: Double) -> APNsRejection? {
        refreshIfDue()
        return state.withLock { s -> APNsRejection? in
            for index in s.rules.indices {
                let rule = s.rules[index]
                guard rule.channelID == channelID, let status = rule.status, let reason = rule.reason else { continue }
                if let times = rule.times {
                    let used = s.attempts[index][channelID, default: 0]
                    if used >= times { continue }
                    s.attempts[index][channelID] = used + 1
                }
                return APNsRejection(status, reason)
            }
            return nil
        }
    }

    /// The GOAWAY rule in force, if any.
    func goaway() -> (afterStreams: Int, reason: String?)? {
        refreshIfDue()
        return state.withLock { s in
            s.rules.first { $0.isConnectionRule }.map { ($0.goawayAfterStreams!, $0.goawayReason) }
        }
    }

    private func refreshIfDue() {
        guard let path else { return }
        let now = ContinuousClock.now
        let due = state.withLock { s -> FileStamp?? in
            if let last = s.lastCheck, now - last < Self.checkInterval { return .none }
            s.lastCheck = now
            return .some(s.stamp)
        }
        guard case .some(let previous) = due else { return }
        guard let stamp = Self.stamp(path), stamp != previous else { return }
        do {
            let (rules, fresh) = try Self.read(path)
            state.withLock { s in
                s.rules = rules
                s.attempts = Array(repeating: [:], count: rules.count)
                s.stamp = fresh
            }
            logger.info("rules reloaded", ["sim.rules": "\(rules.count)"])
        } catch {
            // Keep the old rules; remember the bad file's stamp so the error is logged once per change.
            state.withLock { $0.stamp = stamp }
            logger.error("rules file refused, keeping the previous rules", ["error": "\(error)"])
        }
    }

    private static func read(_ path: String) throws(ConfigurationError) -> ([SimulatorRule], FileStamp?) {
        let stamp = stamp(path)
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ConfigurationError("rules", "cannot read \(path)")
        }
        return (try SimulatorRule.parse(data), stamp)
    }

    private static func stamp(_ path: String) -> FileStamp? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return FileStamp(modified: timespec.Stamp(info.st_mtim), size: Int64(info.st_size), inode: UInt64(info.st_ino))
    }
}

extension timespec {
    /// An Equatable copy of a file time.
    struct Stamp: Equatable {
        var seconds: Int
        var nanoseconds: Int
        init(_ time: timespec) {
            seconds = time.tv_sec
            nanoseconds = time.tv_nsec
        }
    }
}
