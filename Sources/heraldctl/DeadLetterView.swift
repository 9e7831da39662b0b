import Foundation
import HeraldCore
import HeraldRuntime

/// The parts of a dead letter that listing, filtering and replaying read, decoded without the payloads.
///
/// Read from HeraldRuntime's strict JSON parser (`JSONValue(parsing:)`) field by field, with the types and
/// optionality `JSONDecoder` gave the same struct: a member of the wrong type makes the record unreadable, an
/// absent or null optional one is nil, unknown members are ignored. `JSONDecoder` was the largest part of a
/// replay's CPU time (its `Decodable` path builds a container per value); this is several times cheaper. A replay
/// copies the payload's JSON text from the record into the job instead of re-encoding it (see `replayJob`).
struct DeadLetterView: Sendable {
    struct Job: Sendable {
        var id: String?
        var target: PushJob.Target
        var pushType: String?
    }

    /// Only checks that the payload is an object with an `aps` object (what `PushJob.validate` requires).
    struct PayloadShape: Sendable {}

    var version: Int?
    var appId: String
    var job: Job?
    var jobId: String?
    var deviceToken: String?
    var tokenType: TokenType?
    var environment: APNsEnvironment?
    var topic: String?
    var pushType: String?
    var payload: PayloadShape?
    var priority: Int?
    var expiration: Int64?
    var collapseId: String?
    var status: Int?
    var reason: String
    var attempts: Int
    var firstAttemptAt: String?
    var lastAttemptAt: String?
    var deadLetteredAt: String

    static func decode(_ bytes: [UInt8]) -> DeadLetterView? {
        guard let root = JSONValue(parsing: bytes), let view = try? DeadLetterView(ViewFields(root)),
              view.version == nil || view.version == DeadLetter.currentVersion else { return nil }
        return view
    }

    private init(_ fields: ViewFields) throws(ViewFields.Mismatch) {
        version = try fields.integer("version")
        appId = try fields.required(fields.string("appId"))
        if let job = try fields.object("job") {
            let target = try fields.required(job.object("target"))
            // Target's memberwise initializer is HeraldCore's own; every member is set here.
            var decoded = PushJob.Target.channel("")
            decoded.kind = try target.required(target.enumeration("kind", PushJob.Target.Kind.self))
            decoded.channel = try target.string("channel")
            decoded.postIdHash = try target.string("postIdHash")
            decoded.deviceToken = try target.string("deviceToken")
            decoded.tokenType = try target.enumeration("tokenType", TokenType.self)
            decoded.environment = try target.enumeration("environment", APNsEnvironment.self)
            decoded.topic = try target.string("topic")
            self.job = Job(id: try job.string("id"), target: decoded, pushType: try job.string("pushType"))
        }
        jobId = try fields.string("jobId")
        deviceToken = try fields.string("deviceToken")
        tokenType = try fields.enumeration("tokenType", TokenType.self)
        environment = try fields.enumeration("environment", APNsEnvironment.self)
        topic = try fields.string("topic")
        pushType = try fields.string("pushType")
        if let payload = try fields.object("payload") {
            _ = try payload.required(payload.object("aps"))
            self.payload = PayloadShape()
        }
        priority = try fields.integer("priority")
        expiration = try fields.integer("expiration")
        collapseId = try fields.string("collapseId")
        status = try fields.integer("status")
        reason = try fields.required(fields.string("reason"))
        attempts = try fields.required(fields.integer("attempts"))
        firstAttemptAt = try fields.string("firstAttemptAt")
        lastAttemptAt = try fields.string("lastAttemptAt")
        deadLetteredAt = try fields.required(fields.string("deadLetteredAt"))
    }

    /// `apns-push-type` as sent, else what the job asked for, else what its token type implies.
    var effectivePushType: String? {
        if let pushType { return pushType }
        guard let target = job?.target else { return nil }
        if target.kind != .device { return job?.pushType }
        if let pushType = job?.pushType { return pushType }
        return target.tokenType == .alert || target.tokenType == nil ? APNsPushType.alert.rawValue : APNsPushType.liveactivity.rawValue
    }

    /// What the failed job was addressed to, for people: `channel:news`, `post:ab12…`, `device`.
    var targetDescription: String {
        guard let target = job?.target else { return "-" }
        switch target.kind {
        case .channel: return "channel:" + (target.channel ?? "")
        case .post: return "post:" + (target.postIdHash ?? "")
        case .device: return "device"
        }
    }

    /// The device job that sends this push again (`DeadLetter.replayJob`), encoded, with the payload's JSON
    /// copied from `record`. Nil when there is no device or payload to send; throws when the job is invalid.
    func replayJob(record: [UInt8], partition: Int32, offset: Int64, id: String, now: Date) throws(ValidationError)
        -> (key: String, bytes: [UInt8])? {
        guard deviceToken != nil, payload != nil, let raw = RawJSON.member("payload", of: record) else { return nil }
        var letter = DeadLetter(appId: appId, job: nil, reason: reason, attempts: attempts)
        letter.jobId = jobId
        (letter.deviceToken, letter.tokenType, letter.environment, letter.topic) = (deviceToken, tokenType, environment, topic)
        (letter.pushType, letter.priority, letter.expiration, letter.collapseId) = (pushType, priority, expiration, collapseId)
        // A stand-in payload of the right shape lets `validate` check everything else; the real one's size is
        // checked here, and its shape was checked by decoding `payload`.
        letter.payload = .object(["aps": .object([:])])
        guard var job = letter.replayJob(partition: partition, offset: offset, id: id, now: now) else { return nil }
        try job.validate()
        let limit = job.resolvedPushType == .voip ? APNsPayload.maxVoIPBytes : APNsPayload.maxBytes
        guard raw.count <= limit else {
            throw ValidationError(code: "payload_too_large", message: "the payload is \(raw.count) bytes; APNs accepts at most \(limit)",
                                  field: "payload")
        }
        job.payload = .null
        guard let bytes = RawJSON.replacing(Array(#""payload":null"#.utf8), with: Array(#""payload":"#.utf8) + record[raw],
                                            in: job.encoded()) else { return nil }
        return (job.recordKey, bytes)
    }
}

/// Typed access to the members of a parsed JSON object, as `JSONDecoder` reads optional members: absent or
/// null → nil, another type → `Mismatch`.
struct ViewFields {
    struct Mismatch: Error {}

    let members: [String: JSONValue]

    init(_ value: JSONValue) throws(Mismatch) {
        guard case .object(let members) = value else { throw Mismatch() }
        self.members = members
    }

    private func present(_ name: String) -> JSONValue? {
        guard let value = members[name], value != .null else { return nil }
        return value
    }

    func required<T>(_ value: T?) throws(Mismatch) -> T {
        guard let value else { throw Mismatch() }
        return value
    }

    func string(_ name: String) throws(Mismatch) -> String? {
        guard let value = present(name) else { return nil }
        guard case .string(let text) = value else { throw Mismatch() }
        return text
    }

    /// An integral number that fits `T` (`JSONDecoder` refuses `1.5` for an integer too).
    func integer<T: FixedWidthInteger>(_ name: String) throws(Mismatch) -> T? {
        guard let value = present(name) else { return nil }
        guard case .number(let number) = value, number == number.rounded(), let exact = T(exactly: number) else {
            throw Mismatch()
        }
        return exact
    }

    func enumeration<E: RawRepresentable>(_ name: String, _ type: E.Type) throws(Mismatch) -> E? where E.RawValue == String {
        guard let text = try string(name) else { return nil }
        guard let value = E(rawValue: text) else { throw Mismatch() }
        return value
    }

    func object(_ name: String) throws(Mismatch) -> ViewFields? {
        guard let value = present(name) else { return nil }
        return try ViewFields(value)
    }
}

/// Finds members of a JSON object as byte ranges of its text, so a value can be copied without decoding it.
enum RawJSON {
    /// The range of the value of `key` in the top-level object `json`; nil when absent or when the text is not
    /// a well-formed object (or spells the key with escapes: the caller then has nothing to copy).
    static func member(_ key: String, of json: [UInt8]) -> Range<Int>? {
        let wanted = Array(key.utf8)
        var index = skipSpace(json, 0)
        guard index < json.count, json[index] == UInt8(ascii: "{") else { return nil }
        index += 1
        while true {
            index = skipSpace(json, index)
            guard index < json.count, json[index] == UInt8(ascii: "\"") else { return nil }
            guard let keyEnd = skipString(json, index) else { return nil }
            let name = json[(index + 1)..<(keyEnd - 1)]
            index = skipSpace(json, keyEnd)
            guard index < json.count, json[index] == UInt8(ascii: ":") else { return nil }
            let valueStart = skipSpace(json, index + 1)
            guard let valueEnd = skipValue(json, valueStart) else { return nil }
            if name.elementsEqual(wanted) { return valueStart..<valueEnd }
            index = skipSpace(json, valueEnd)
            guard index < json.count else { return nil }
            if json[index] == UInt8(ascii: "}") { return nil }
            guard json[index] == UInt8(ascii: ",") else { return nil }
            index += 1
        }
    }

    /// `bytes` with the first occurrence of `pattern` replaced. Used on JSONEncoder output, where a quote that
    /// is part of a string value is always escaped, so `"payload":null` can only be the member itself.
    static func replacing(_ pattern: [UInt8], with replacement: some Collection<UInt8>, in bytes: [UInt8]) -> [UInt8]? {
        guard pattern.count <= bytes.count else { return nil }
        for start in 0...(bytes.count - pattern.count) where bytes[start] == pattern[0] {
            if bytes[start..<(start + pattern.count)].elementsEqual(pattern) {
                var out = Array(bytes[..<start])
                out.reserveCapacity(bytes.count + replacement.count)
                out.append(contentsOf: replacement)
                out.append(contentsOf: bytes[(start + pattern.count)...])
                return out
            }
        }
        return nil
    }

    private static func skipSpace(_ json: [UInt8], _ start: Int) -> Int {
        var index = start
        while index < json.count, [0x20, 0x09, 0x0a, 0x0d].contains(json[index]) { index += 1 }
        return index
    }

    /// From an opening quote to just after the closing one.
    private static func skipString(_ json: [UInt8], _ start: Int) -> Int? {
        var index = start + 1
        while index < json.count {
            switch json[index] {
            case UInt8(ascii: "\\"): index += 2
            case UInt8(ascii: "\""): return index + 1
            default: index += 1
            }
        }
        return nil
    }

    /// Just after the value starting at `start`: a string, an object or array (nesting counted, strings skipped
    /// whole), or a number or literal.
    private static func skipValue(_ json: [UInt8], _ start: Int) -> Int? {
        guard start < json.count else { return nil }
        switch json[start] {
        case UInt8(ascii: "\""):
            return skipString(json, start)
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            var depth = 0, index = start
            while index < json.count {
                switch json[index] {
                case UInt8(ascii: "\""):
                    guard let end = skipString(json, index) else { return nil }
                    index = end
                    continue
                case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1
                case UInt8(ascii: "}"), UInt8(ascii: "]"):
                    depth -= 1
                    if depth == 0 { return index + 1 }
                default: break
                }
                index += 1
            }
            return nil
        default:
            var index = start
            while index < json.count, ![UInt8(ascii: ","), UInt8(ascii: "}"), UInt8(ascii: "]"), 0x20, 0x09, 0x0a, 0x0d]
                .contains(json[index]) { index += 1 }
            return index > start ? index : nil
        }
    }
}

/// `items.map(transform)` spread over the machine's cores: decoding and encoding JSON is most of a replay's CPU
/// time. Runs on the calling thread plus Dispatch's workers, and returns when every item is done.
func parallelMap<T: Sendable, R: Sendable>(_ items: [T], _ transform: @Sendable (T) -> R) -> [R] {
    let chunks = min(items.count, ProcessInfo.processInfo.activeProcessorCount * 2)
    guard chunks > 1 else { return items.map(transform) }
    return Array(unsafeUninitializedCapacity: items.count) { buffer, initialized in
        // Each chunk initializes its own disjoint range of the buffer.
        nonisolated(unsafe) let output = buffer.baseAddress!
        DispatchQueue.concurrentPerform(iterations: chunks) { chunk in
            let range = (items.count * chunk / chunks)..<(items.count * (chunk + 1) / chunks)
            for index in range { (output + index).initialize(to: transform(items[index])) }
        }
        initialized = items.count
    }
}
