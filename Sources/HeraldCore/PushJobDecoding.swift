import HeraldAPNsCore
import HeraldRuntime

/// `PushJob.decode` reads the record with HeraldRuntime's strict parser and takes the fields from the tree by
/// hand: `JSONDecoder` (with `JSONValue`'s `Decodable` conformance trying each case in turn) was the largest part
/// of the dispatcher's CPU time per job. The rules are the Codable form's: required members present with the
/// right type, optional ones absent (a `null` is refused, as is any member the format does not define), JSON
/// values kept whole for `validate()` to judge.
extension PushJob {
    private static let fields: Set<String> = ["version", "id", "appId", "createdAt", "target", "alert", "liveActivity",
                                              "start", "payload", "pushType", "priority", "expiration", "collapseId",
                                              "final", "broadcastChannel", "replayOf"]
    /// A target carries only its own kind's fields (as the schema's `oneOf` says).
    private static let targetFields: [Target.Kind: Set<String>] = [
        .channel: ["kind", "channel"], .post: ["kind", "postIdHash"],
        .device: ["kind", "deviceToken", "tokenType", "environment", "topic"],
        .broadcast: ["kind", "channelId", "environment", "storagePolicy"],
    ]
    private static let liveActivityFields: Set<String> = ["event", "contentState", "alert", "staleDate", "dismissalDate",
                                                          "relevanceScore", "activityID"]
    private static let startFields: Set<String> = ["attributesType", "attributes", "contentState", "alert", "inputPushChannel",
                                                   "inputPushToken"]
    private static let broadcastChannelFields: Set<String> = ["environment", "storagePolicy"]
    private static let replayOfFields: Set<String> = ["jobId", "dlqPartition", "dlqOffset", "channel", "postIdHash"]
    /// Integers a JSON number (a `Double`) holds exactly.
    private static let exact: ClosedRange<Int64> = -(1 << 53) + 1...(1 << 53) - 1
    private static let int32: ClosedRange<Int64> = Int64(Int32.min)...Int64(Int32.max)

    /// Decodes a record of `herald.jobs`. Like the schema, it refuses fields the format does not define, so a
    /// misspelt field (`collapseID`) is dead-lettered rather than silently dropped. Call `validate()` next.
    public static func decode(_ bytes: [UInt8]) throws(ValidationError) -> PushJob {
        guard let root = JSONValue(parsing: bytes) else { throw ValidationError(code: "invalid_job", message: "not a push job: invalid JSON (\(JSONValue.inexactIntegerHint))") }
        return try decode(root)
    }

    /// Decodes a job already parsed (a dead letter's `job`), by the same rules.
    public static func decode(_ root: JSONValue) throws(ValidationError) -> PushJob {
        do throws(ValidationError) {
            let job = try JobFields(root, allowed: fields)
            var decoded = PushJob(
                version: Int(try job.required(job.reader.integer("version", in: int32), "version")),
                id: try job.required(job.reader.string("id"), "id"),
                appId: try job.required(job.reader.string("appId"), "appId"),
                createdAt: try job.required(job.reader.string("createdAt"), "createdAt"),
                target: try decodeTarget(job.required("target")))
            decoded.alert = job.reader.value("alert")
            if let live = job.reader.value("liveActivity") {
                let fields = try JobFields(live, allowed: liveActivityFields, prefix: "liveActivity.", nullable: ["contentState"])
                decoded.liveActivity = LiveActivity(
                    event: try fields.required(fields.reader.enumeration("event", LiveActivity.Event.self), "event"),
                    contentState: try fields.required("contentState"), alert: fields.reader.value("alert"),
                    staleDate: try fields.reader.integer("staleDate", in: exact),
                    dismissalDate: try fields.reader.integer("dismissalDate", in: exact),
                    relevanceScore: try fields.reader.number("relevanceScore"),
                    activityID: try fields.reader.string("activityID"))
            }
            if let start = job.reader.value("start") {
                let fields = try JobFields(start, allowed: startFields, prefix: "start.", nullable: ["attributes", "contentState", "alert"])
                decoded.start = Start(attributesType: try fields.required(fields.reader.string("attributesType"), "attributesType"),
                                      attributes: try fields.required("attributes"),
                                      contentState: try fields.required("contentState"), alert: try fields.required("alert"),
                                      inputPushChannel: try fields.reader.string("inputPushChannel"),
                                      inputPushToken: try fields.reader.bool("inputPushToken"))
            }
            decoded.payload = job.reader.value("payload")
            decoded.pushType = try job.reader.string("pushType")
            decoded.priority = try job.reader.integer("priority", in: int32).map { Int($0) }
            decoded.expiration = try job.reader.integer("expiration", in: exact)
            decoded.collapseId = try job.reader.string("collapseId")
            decoded.final = try job.reader.bool("final")
            if let request = job.reader.value("broadcastChannel") {
                let fields = try JobFields(request, allowed: broadcastChannelFields, prefix: "broadcastChannel.")
                decoded.broadcastChannel = BroadcastChannel(
                    environment: try fields.required(fields.reader.enumeration("environment", APNsEnvironment.self), "environment"),
                    storagePolicy: try fields.required(fields.reader.storagePolicy("storagePolicy"), "storagePolicy"))
            }
            if let replayOf = job.reader.value("replayOf") {
                let fields = try JobFields(replayOf, allowed: replayOfFields, prefix: "replayOf.")
                decoded.replayOf = ReplayOf(
                    jobId: try fields.required(fields.reader.string("jobId"), "jobId"),
                    dlqPartition: Int32(try fields.required(fields.reader.integer("dlqPartition", in: 0...int32.upperBound),
                                                            "dlqPartition")),
                    dlqOffset: try fields.required(fields.reader.integer("dlqOffset", in: 0...exact.upperBound), "dlqOffset"),
                    channel: try fields.reader.string("channel"), postIdHash: try fields.reader.string("postIdHash"))
                if let channel = decoded.replayOf?.channel { try Channel.validate(channel, field: "replayOf.channel") }
                if let post = decoded.replayOf?.postIdHash { try PostIDHash.validate(post, field: "replayOf.postIdHash") }
            }
            return decoded
        } catch {
            throw ValidationError(code: "invalid_job", message: "not a push job: \(error.message)", field: error.field)
        }
    }

    private static func decodeTarget(_ value: JSONValue) throws(ValidationError) -> Target {
        let kind = try FieldReader(value, prefix: "target.").enumeration("kind", Target.Kind.self)
        guard let kind else { throw .missing("target.kind") }
        let target = try JobFields(value, allowed: targetFields[kind]!, prefix: "target.")
        switch kind {
        case .channel: return .channel(try target.required(target.reader.string("channel"), "channel"))
        case .post: return .post(try target.required(target.reader.string("postIdHash"), "postIdHash"))
        case .device:
            return .device(try target.required(target.reader.string("deviceToken"), "deviceToken"),
                           tokenType: try target.required(target.reader.enumeration("tokenType", TokenType.self), "tokenType"),
                           environment: try target.reader.enumeration("environment", APNsEnvironment.self),
                           topic: try target.reader.string("topic"))
        case .broadcast:
            return .broadcast(Target.Broadcast(
                channelId: try target.required(target.reader.string("channelId"), "channelId"),
                environment: try target.required(target.reader.enumeration("environment", APNsEnvironment.self), "environment"),
                storagePolicy: try target.required(target.reader.storagePolicy("storagePolicy"), "storagePolicy")))
        }
    }

    private init(version: Int, id: String, appId: String, createdAt: String, target: Target) {
        (self.version, self.id, self.appId, self.createdAt, self.target) = (version, id, appId, createdAt, target)
    }
}

/// One object of a job record: only the format's members, none of them `null` (the Codable form leaves absent
/// fields out; a JSON value that is itself required, such as `contentState`, may be anything for `validate()`).
private struct JobFields {
    let reader: FieldReader

    /// `nullable`: members whose value is any JSON value, `null` included.
    init(_ value: JSONValue, allowed: Set<String>, prefix: String = "", nullable: Set<String> = []) throws(ValidationError) {
        do { reader = try FieldReader(value, allowed: allowed, prefix: prefix) } catch {
            // FieldReader names the body; here it is the job or one of its objects.
            if error.code == "invalid_body" {
                let name = prefix.isEmpty ? "the job" : String(prefix.dropLast())
                throw ValidationError(code: "invalid_field", message: "\(name) must be a JSON object", field: error.field)
            }
            throw error
        }
        // The first in sorted order, without sorting the keys of every valid object.
        if let name = reader.object.lazy.filter({ $0.value == .null && !nullable.contains($0.key) }).map(\.key).min() {
            throw .invalid(reader.name(name), "\(reader.name(name)) is null (leave it out instead)")
        }
    }

    func required<T>(_ value: T?, _ field: String) throws(ValidationError) -> T {
        guard let value else { throw .missing(reader.name(field)) }
        return value
    }

    /// A required member holding any JSON value (`null` included).
    func required(_ field: String) throws(ValidationError) -> JSONValue {
        guard let value = reader.object[field] else { throw .missing(reader.name(field)) }
        return value
    }
}
