import Foundation
import HeraldRuntime

/// One message on `herald.jobs` (schemas/push-job.schema.json, version 1): what to send, to whom.
///
/// Ingest builds jobs from events; any producer may write them directly, so the dispatcher decodes and calls
/// `validate()` on every job before acting on it.
public struct PushJob: Sendable, Codable, Equatable {
    public static let currentVersion = 1

    public struct Target: Sendable, Codable, Equatable {
        public enum Kind: String, Sendable, Codable, CaseIterable { case channel, post, device }
        public var kind: Kind
        public var channel: String?
        public var postIdHash: String?
        public var deviceToken: String?
        public var tokenType: TokenType?
        public var environment: APNsEnvironment?
        /// Device jobs only: the `apns-topic`, when not the app's bundle id (replays of Live Activity pushes).
        public var topic: String?

        public static func channel(_ name: String) -> Target { Target(kind: .channel, channel: name) }

        var jsonValue: JSONValue {
            var fields: [String: JSONValue] = ["kind": .string(kind.rawValue)]
            fields["channel"] = channel.map { .string($0) }
            fields["postIdHash"] = postIdHash.map { .string($0) }
            fields["deviceToken"] = deviceToken.map { .string($0) }
            fields["tokenType"] = tokenType.map { .string($0.rawValue) }
            fields["environment"] = environment.map { .string($0.rawValue) }
            fields["topic"] = topic.map { .string($0) }
            return .object(fields)
        }
        public static func post(_ hash: String) -> Target { Target(kind: .post, postIdHash: hash) }
        public static func device(_ token: String, tokenType: TokenType, environment: APNsEnvironment,
                                  topic: String? = nil) -> Target {
            Target(kind: .device, deviceToken: token, tokenType: tokenType, environment: environment, topic: topic)
        }
    }

    /// A Live Activity `update` or `end`.
    public struct LiveActivity: Sendable, Codable, Equatable {
        public enum Event: String, Sendable, Codable, CaseIterable { case update, end }
        public var event: Event
        public var contentState: JSONValue
        public var alert: JSONValue?
        public var staleDate: Int64?
        public var dismissalDate: Int64?
        public var relevanceScore: Double?
        /// Channel jobs: only `liveactivity-update` subscriptions with this activityID receive it.
        public var activityID: String?

        var jsonValue: JSONValue {
            var fields: [String: JSONValue] = ["event": .string(event.rawValue), "contentState": contentState]
            fields["alert"] = alert
            fields["staleDate"] = staleDate.map { .number(Double($0)) }
            fields["dismissalDate"] = dismissalDate.map { .number(Double($0)) }
            fields["relevanceScore"] = relevanceScore.map { .number($0) }
            fields["activityID"] = activityID.map { .string($0) }
            return .object(fields)
        }

        public init(event: Event, contentState: JSONValue, alert: JSONValue? = nil, staleDate: Int64? = nil,
                    dismissalDate: Int64? = nil, relevanceScore: Double? = nil, activityID: String? = nil) {
            (self.event, self.contentState, self.alert) = (event, contentState, alert)
            (self.staleDate, self.dismissalDate, self.relevanceScore, self.activityID) =
                (staleDate, dismissalDate, relevanceScore, activityID)
        }
    }

    /// A push-to-start of a new Live Activity (iOS 17.2+).
    public struct Start: Sendable, Codable, Equatable {
        public var attributesType: String
        public var attributes: JSONValue
        public var contentState: JSONValue
        public var alert: JSONValue

        public init(attributesType: String, attributes: JSONValue, contentState: JSONValue, alert: JSONValue) {
            (self.attributesType, self.attributes, self.contentState, self.alert) =
                (attributesType, attributes, contentState, alert)
        }
    }

    /// Set on jobs `heraldctl replay` re-publishes from the dead-letter topic.
    public struct ReplayOf: Sendable, Codable, Equatable {
        public var jobId: String
        public var dlqPartition: Int32
        public var dlqOffset: Int64

        public init(jobId: String, dlqPartition: Int32, dlqOffset: Int64) {
            (self.jobId, self.dlqPartition, self.dlqOffset) = (jobId, dlqPartition, dlqOffset)
        }
    }

    public var version: Int
    public var id: String
    public var appId: String
    /// RFC 3339 with milliseconds, UTC.
    public var createdAt: String
    public var target: Target
    /// Channel jobs: the complete APNs payload for `alert` subscribers.
    public var alert: JSONValue?
    public var liveActivity: LiveActivity?
    public var start: Start?
    /// Device jobs: the complete APNs payload.
    public var payload: JSONValue?
    /// Device jobs: `apns-push-type`; defaults from the token type.
    public var pushType: String?
    public var priority: Int?
    /// UNIX seconds; 0 means deliver once and don't store.
    public var expiration: Int64?
    public var collapseId: String?
    /// Post jobs: the last update; the post's registrations are removed once it is sent.
    public var final: Bool?
    public var replayOf: ReplayOf?

    public init(id: String, appId: String, createdAt: Date = Date(), target: Target) {
        self.version = Self.currentVersion
        self.id = id
        self.appId = appId
        self.createdAt = Timestamp.rfc3339(createdAt)
        self.target = target
    }

    /// The Kafka record key: one target's jobs go to one partition, in order.
    public var recordKey: String {
        switch target.kind {
        case .channel: "\(appId)/\(target.channel ?? "")"
        case .post: "\(appId)/post/\(target.postIdHash ?? "")"
        case .device: "\(appId)/device/\(target.deviceToken ?? "")"
        }
    }

    /// True when this job ends its Live Activities (an `end` event or `final`).
    public var isFinal: Bool { final == true || liveActivity?.event == .end }

    /// The record value: compact JSON with sorted keys, absent fields left out (as the Codable form).
    public func encoded() -> [UInt8] { jsonValue.encoded() }

    /// The job as a JSON value, field for field as its Codable form (built by hand: `JSONEncoder` was the larger
    /// part of herald-ingest's CPU time per event).
    var jsonValue: JSONValue {
        var fields: [String: JSONValue] = [
            "version": .number(Double(version)), "id": .string(id), "appId": .string(appId),
            "createdAt": .string(createdAt), "target": target.jsonValue,
        ]
        fields["alert"] = alert
        fields["liveActivity"] = liveActivity?.jsonValue
        if let start {
            fields["start"] = .object(["attributesType": .string(start.attributesType), "attributes": start.attributes,
                                       "contentState": start.contentState, "alert": start.alert])
        }
        fields["payload"] = payload
        fields["pushType"] = pushType.map { .string($0) }
        fields["priority"] = priority.map { .number(Double($0)) }
        fields["expiration"] = expiration.map { .number(Double($0)) }
        fields["collapseId"] = collapseId.map { .string($0) }
        fields["final"] = final.map { .bool($0) }
        if let replayOf {
            fields["replayOf"] = .object(["jobId": .string(replayOf.jobId), "dlqPartition": .number(Double(replayOf.dlqPartition)),
                                          "dlqOffset": .number(Double(replayOf.dlqOffset))])
        }
        return .object(fields)
    }

    /// Checks every rule of the job format, including the size of each payload Herald will build.
    public func validate() throws(ValidationError) {
        guard version == Self.currentVersion else { throw .invalid("version", "version must be \(Self.currentVersion)") }
        guard !id.isEmpty, id.utf8.count <= 128, id.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7f }) else {
            throw .invalid("id", "id must be 1–128 visible ASCII characters")
        }
        guard !appId.isEmpty else { throw .missing("appId") }
        guard Timestamp.isValid(createdAt) else { throw .invalid("createdAt", "createdAt must be an RFC 3339 time") }
        if let priority, ![1, 5, 10].contains(priority) { throw .invalid("priority", "priority must be 1, 5 or 10") }
        if let expiration, expiration < 0 { throw .invalid("expiration", "expiration must be UNIX seconds ≥ 0") }
        if let collapseId {
            // APNs allows 64 bytes; printable ASCII makes that 64 characters too, so JSON Schema can say it exactly.
            guard (1...64).contains(collapseId.utf8.count),
                  collapseId.unicodeScalars.allSatisfy({ (0x20...0x7e).contains($0.value) }) else {
                throw .invalid("collapseId", "collapseId must be 1–64 printable ASCII characters (APNs takes at most 64 bytes)")
            }
        }
        try checkTargetFields()
        switch target.kind {
        case .channel:
            try Self.validateChannel(target.channel ?? "", field: "target.channel")
            guard alert != nil || liveActivity != nil || start != nil else {
                throw ValidationError(code: "missing_field", message: "a channel job needs alert, liveActivity or start")
            }
            try rejectParts(payload: true, final: true)
        case .post:
            try PostIDHash.validate(target.postIdHash ?? "", field: "target.postIdHash")
            guard liveActivity != nil else { throw .missing("liveActivity") }
            guard alert == nil, start == nil else {
                throw ValidationError(code: "invalid_field", message: "a post job carries only liveActivity")
            }
            try rejectParts(payload: true, final: false)
            if liveActivity?.activityID != nil {
                throw ValidationError(code: "invalid_field", message: "activityID belongs to channel jobs",
                                      field: "liveActivity.activityID")
            }
        case .device:
            guard try DeviceToken.normalized(target.deviceToken ?? "", field: "target.deviceToken") == target.deviceToken else {
                throw .invalid("target.deviceToken", "target.deviceToken must be lowercase hex (it is part of the record key)")
            }
            if target.topic?.isEmpty == true { throw .invalid("target.topic", "target.topic must not be empty") }
            guard target.tokenType != nil else { throw .missing("target.tokenType") }
            guard payload != nil else { throw .missing("payload") }
            guard alert == nil, liveActivity == nil, start == nil else {
                throw ValidationError(code: "invalid_field", message: "a device job carries its payload in payload")
            }
            try rejectParts(payload: false, final: true)
            if let pushType, PushType(rawValue: pushType) == nil {
                throw .invalid("pushType", "pushType must be one of \(PushType.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            if resolvedPushType == .background, priority == 10 {
                throw .invalid("priority", "background pushes must use priority 5 or 1")
            }
        }
        if let alert { try APNsPayload.checkComplete(alert, field: "alert") }
        if let liveActivity {
            guard case .object = liveActivity.contentState else {
                throw .invalid("liveActivity.contentState", "liveActivity.contentState must be a JSON object")
            }
            if let alert = liveActivity.alert, case .object = alert {} else if liveActivity.alert != nil {
                throw .invalid("liveActivity.alert", "liveActivity.alert must be a JSON object")
            }
            for (name, value) in [("staleDate", liveActivity.staleDate), ("dismissalDate", liveActivity.dismissalDate)] {
                if let value, value < 0 { throw .invalid("liveActivity.\(name)", "liveActivity.\(name) must be UNIX seconds ≥ 0") }
            }
        }
        if let start {
            guard !start.attributesType.isEmpty else { throw .missing("start.attributesType") }
            for (name, value) in [("attributes", start.attributes), ("contentState", start.contentState), ("alert", start.alert)] {
                guard case .object = value else { throw .invalid("start.\(name)", "start.\(name) must be a JSON object") }
            }
        }
        if let payload { try APNsPayload.checkComplete(payload, field: "payload") }
        try checkSizes()
    }

    /// Device jobs: the push type to send.
    public var resolvedPushType: PushType {
        if let pushType, let type = PushType(rawValue: pushType) { return type }
        return target.tokenType == .alert || target.tokenType == nil ? .alert : .liveactivity
    }

    /// A channel name as subscriptions take it, counted in Unicode scalars (as JSON Schema's `maxLength` counts).
    static func validateChannel(_ channel: String, field: String) throws(ValidationError) {
        guard channel.utf8.count <= Channel.maxLength || channel.unicodeScalars.count <= Channel.maxLength else {
            throw .invalid(field, "\(field) must be at most \(Channel.maxLength) characters")
        }
        try Channel.validate(channel, field: field)
    }

    /// A target carries only its own kind's fields (as the schema's `oneOf` says).
    private func checkTargetFields() throws(ValidationError) {
        let present: [(String, Bool)] = [("channel", target.channel != nil), ("postIdHash", target.postIdHash != nil),
                                         ("deviceToken", target.deviceToken != nil), ("tokenType", target.tokenType != nil),
                                         ("environment", target.environment != nil), ("topic", target.topic != nil)]
        let own: Set<String> = switch target.kind {
        case .channel: ["channel"]
        case .post: ["postIdHash"]
        case .device: ["deviceToken", "tokenType", "environment", "topic"]
        }
        if let stray = present.first(where: { $0.1 && !own.contains($0.0) }) {
            throw ValidationError(code: "invalid_field", message: "a \(target.kind.rawValue) target has no \(stray.0)",
                                  field: "target.\(stray.0)")
        }
    }

    private func rejectParts(payload rejectPayload: Bool, final rejectFinal: Bool) throws(ValidationError) {
        if rejectPayload, payload != nil || pushType != nil {
            throw ValidationError(code: "invalid_field", message: "payload and pushType belong to device jobs", field: "payload")
        }
        if rejectFinal, final != nil {
            throw ValidationError(code: "invalid_field", message: "final belongs to post jobs", field: "final")
        }
    }

    /// Every payload this job can produce must fit APNs' limit once Herald adds its `aps` fields.
    private func checkSizes() throws(ValidationError) {
        let now = Int64(Date().timeIntervalSince1970)
        var built: [(String, [UInt8], Int)] = []
        if let alert { built.append(("alert", alert.encoded(), APNsPayload.maxBytes)) }
        if let liveActivity { built.append(("liveActivity", APNsPayload.liveActivity(liveActivity, timestamp: now).encoded(), APNsPayload.maxBytes)) }
        if let start { built.append(("start", APNsPayload.start(start, timestamp: now).encoded(), APNsPayload.maxBytes)) }
        if let payload {
            let limit = resolvedPushType == .voip ? APNsPayload.maxVoIPBytes : APNsPayload.maxBytes
            built.append(("payload", payload.encoded(), limit))
        }
        for (field, bytes, limit) in built where bytes.count > limit {
            throw ValidationError(code: "payload_too_large",
                                  message: "the \(field) payload is \(bytes.count) bytes; APNs accepts at most \(limit)",
                                  field: field)
        }
    }
}

/// Apple's `apns-push-type` values.
public enum PushType: String, Sendable, Codable, CaseIterable {
    case alert, background, location, voip, complication, fileprovider, mdm, liveactivity, pushtotalk, widgets, controls
}

/// Builds the APNs payloads Herald sends.
public enum APNsPayload {
    public static let maxBytes = 4096
    public static let maxVoIPBytes = 5120

    /// A complete payload: a JSON object with an `aps` object (custom keys beside it are kept).
    static func checkComplete(_ payload: JSONValue, field: String) throws(ValidationError) {
        guard case .object(let object) = payload else { throw .invalid(field, "\(field) must be a JSON object") }
        guard case .object = object["aps"] else { throw .invalid(field, "\(field) must have an \"aps\" object") }
    }

    /// `aps` of a Live Activity update or end.
    public static func liveActivity(_ content: PushJob.LiveActivity, timestamp: Int64) -> JSONValue {
        var aps: [String: JSONValue] = [
            "timestamp": .number(Double(timestamp)),
            "event": .string(content.event.rawValue),
            "content-state": content.contentState,
        ]
        if let staleDate = content.staleDate { aps["stale-date"] = .number(Double(staleDate)) }
        if let dismissalDate = content.dismissalDate { aps["dismissal-date"] = .number(Double(dismissalDate)) }
        if let relevanceScore = content.relevanceScore { aps["relevance-score"] = .number(relevanceScore) }
        if let alert = content.alert { aps["alert"] = alert }
        return .object(["aps": .object(aps)])
    }

    /// `aps` of a push-to-start.
    public static func start(_ content: PushJob.Start, timestamp: Int64) -> JSONValue {
        .object(["aps": .object([
            "timestamp": .number(Double(timestamp)),
            "event": .string("start"),
            "content-state": content.contentState,
            "attributes-type": .string(content.attributesType),
            "attributes": content.attributes,
            "alert": content.alert,
        ])])
    }
}

/// RFC 3339 times with milliseconds in UTC, as in jobs, dead letters and API bodies.
public enum Timestamp {
    /// `2026-11-30T06:03:18.123Z`: whole milliseconds, truncated (as Foundation's ISO 8601 style writes them).
    ///
    /// Written by hand for 1970–9999: Foundation's format style was a few percent of herald-ingest's CPU per
    /// event (every job gets a `createdAt`). Other times go through Foundation.
    public static func rfc3339(_ date: Date) -> String {
        let interval = date.timeIntervalSince1970
        let whole = interval.rounded(.down)
        guard whole >= 0, whole < 253_402_300_800 else { // 1970-01-01 ... 9999-12-31
            return foundationRFC3339(date)
        }
        return format(seconds: Int64(whole), millis: min(999, Int((interval - whole) * 1000)))
    }

    /// `rfc3339` of a time in whole milliseconds since 1970, exact (no trip through a `Double`'s fraction): a
    /// registration stores its last-seen time in milliseconds and readers format it from them.
    public static func rfc3339(milliseconds: Int64) -> String {
        guard milliseconds >= 0, milliseconds < 253_402_300_800_000 else {
            return foundationRFC3339(Date(timeIntervalSince1970: Double(milliseconds) / 1000))
        }
        return format(seconds: milliseconds / 1000, millis: Int(milliseconds % 1000))
    }

    /// `YYYY-MM-DDTHH:MM:SS.sssZ` of a time in 1970–9999.
    private static func format(seconds: Int64, millis: Int) -> String {
        let (days, secondOfDay) = (seconds / 86_400, Int(seconds % 86_400))
        let (year, month, day) = civil(fromDays: days)
        return String(unsafeUninitializedCapacity: 24) { buffer in
            func put(_ value: Int, _ digits: Int, at offset: Int) {
                var value = value
                for index in stride(from: offset + digits - 1, through: offset, by: -1) {
                    buffer[index] = UInt8(ascii: "0") + UInt8(value % 10)
                    value /= 10
                }
            }
            put(year, 4, at: 0); buffer[4] = UInt8(ascii: "-")
            put(month, 2, at: 5); buffer[7] = UInt8(ascii: "-")
            put(day, 2, at: 8); buffer[10] = UInt8(ascii: "T")
            put(secondOfDay / 3600, 2, at: 11); buffer[13] = UInt8(ascii: ":")
            put(secondOfDay / 60 % 60, 2, at: 14); buffer[16] = UInt8(ascii: ":")
            put(secondOfDay % 60, 2, at: 17); buffer[19] = UInt8(ascii: ".")
            put(millis, 3, at: 20); buffer[23] = UInt8(ascii: "Z")
            return 24
        }
    }

    /// Foundation's formatting, for years outside 1970–9999 and as the reference in tests.
    public static func foundationRFC3339(_ date: Date) -> String {
        date.formatted(.iso8601.year().month().day().dateSeparator(.dash).time(includingFractionalSeconds: true)
            .timeSeparator(.colon).timeZone(separator: .omitted))
    }

    public static func parse(_ text: String) -> Date? {
        if let date = try? Date(text, strategy: .iso8601.year().month().day().dateSeparator(.dash)
            .time(includingFractionalSeconds: true).timeSeparator(.colon).timeZone(separator: .omitted)) { return date }
        return try? Date(text, strategy: .iso8601)
    }

    /// Whether `parse` accepts `text`. The shape `rfc3339` writes, with every field in range, is checked by hand
    /// (`PushJob.validate` checks the `createdAt` of every job built); anything else is left to `parse`.
    public static func isValid(_ text: String) -> Bool {
        isCanonical(text) || parse(text) != nil
    }

    /// `YYYY-MM-DDTHH:MM:SS.sssZ` naming a real day of years 1970–9999 and a time before 24:00.
    static func isCanonical(_ text: String) -> Bool {
        let bytes = text.utf8
        guard bytes.count == 24 else { return false }
        var digits: [Int] = []
        digits.reserveCapacity(17)
        for (index, byte) in bytes.enumerated() {
            switch index {
            case 4, 7: guard byte == UInt8(ascii: "-") else { return false }
            case 10: guard byte == UInt8(ascii: "T") else { return false }
            case 13, 16: guard byte == UInt8(ascii: ":") else { return false }
            case 19: guard byte == UInt8(ascii: ".") else { return false }
            case 23: guard byte == UInt8(ascii: "Z") else { return false }
            default:
                guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return false }
                digits.append(Int(byte - UInt8(ascii: "0")))
            }
        }
        func number(_ range: Range<Int>) -> Int { digits[range].reduce(0) { $0 * 10 + $1 } }
        let (year, month, day) = (number(0..<4), number(4..<6), number(6..<8))
        let (hour, minute, second) = (number(8..<10), number(10..<12), number(12..<14))
        guard year >= 1970, (1...12).contains(month), hour < 24, minute < 60, second < 60 else { return false }
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
        let monthDays = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        return (1...monthDays[month - 1]).contains(day)
    }

    /// Gregorian year, month and day of a count (≥ 0) of days since 1970-01-01 (H. Hinnant's `civil_from_days`).
    private static func civil(fromDays days: Int64) -> (year: Int, month: Int, day: Int) {
        let shifted = days + 719_468
        let era = shifted / 146_097
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        return (Int(yearOfEra + era * 400 + (month <= 2 ? 1 : 0)), Int(month), Int(day))
    }
}
