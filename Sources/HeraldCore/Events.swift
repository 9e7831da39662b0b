import Foundation
import HeraldAPNsCore
import HeraldCrypto
import HeraldRuntime

/// Producer events (`POST …/events`, `…/push`) turned into push jobs. Each builder checks the body field by field,
/// then the finished job against every rule of the job format.
public enum EventIntake {
    /// `POST /v1/apps/{appID}/events`: a channel event.
    public static func channelEvent(_ body: JSONValue, appID: String, jobID: String?) throws(ValidationError) -> PushJob {
        let fields = try FieldReader(body, allowed: ["channel", "alert", "liveActivity", "start", "priority",
                                                     "expiration", "collapseId", "id", "final"])
        let channel = try fields.requiredString("channel")
        try PushJob.validateChannel(channel, field: "channel")
        var job = PushJob(id: try jobIdentifier(fields, jobID), appId: appID, target: .channel(channel))
        job.alert = try fields.object("alert")
        if let live = try fields.object("liveActivity") {
            job.liveActivity = try liveActivity(FieldReader(live, allowed: liveActivityFields.union(["activityID"]),
                                                            prefix: "liveActivity."))
        }
        if let start = try fields.object("start") {
            let s = try FieldReader(start, allowed: ["attributesType", "attributes", "contentState", "alert",
                                                     "inputPushChannel", "inputPushToken"], prefix: "start.")
            job.start = PushJob.Start(attributesType: try s.requiredString("attributesType"),
                                      attributes: try s.requiredObject("attributes"),
                                      contentState: try s.requiredObject("contentState"),
                                      alert: try s.requiredObject("alert"),
                                      inputPushChannel: try s.string("inputPushChannel"),
                                      inputPushToken: try s.bool("inputPushToken"))
        }
        guard job.alert != nil || job.liveActivity != nil || job.start != nil else {
            throw ValidationError(code: "missing_field", message: "an event needs at least one of alert, liveActivity or start",
                                  field: "alert")
        }
        job.final = try fields.bool("final")
        try common(fields, into: &job)
        try job.validate()
        return job
    }

    /// `POST /v1/apps/{appID}/activities/{postIdHash}/events`: a Live Activity update or end for a post.
    public static func activityEvent(_ body: JSONValue, appID: String, postIDHash: String,
                                     jobID: String?) throws(ValidationError) -> PushJob {
        try PostIDHash.validate(postIDHash, field: "postIdHash")
        let fields = try FieldReader(body, allowed: liveActivityFields.union(["final", "priority", "expiration",
                                                                              "collapseId", "id"]))
        var job = PushJob(id: try jobIdentifier(fields, jobID), appId: appID, target: .post(postIDHash))
        job.liveActivity = try liveActivity(fields)
        job.final = try fields.bool("final")
        try common(fields, into: &job)
        try job.validate()
        return job
    }

    /// `POST /v1/apps/{appID}/activities/{postIdHash}/broadcast`: `{environment, storagePolicy?}` → the job that
    /// makes the post's broadcast channel (storage policy `noStorage` unless given).
    public static func broadcastChannel(_ body: JSONValue, appID: String,
                                        postIDHash: String) throws(ValidationError) -> PushJob {
        try PostIDHash.validate(postIDHash, field: "postIdHash")
        let fields = try FieldReader(body, allowed: ["environment", "storagePolicy"])
        guard let environment = try fields.enumeration("environment", APNsEnvironment.self) else {
            throw .missing("environment")
        }
        let policy = try fields.storagePolicy("storagePolicy") ?? .noStorage
        var job = PushJob(id: randomUUID(), appId: appID, target: .post(postIDHash))
        job.broadcastChannel = PushJob.BroadcastChannel(environment: environment, storagePolicy: policy)
        try job.validate()
        return job
    }

    /// `POST /v1/apps/{appID}/devices/{deviceToken}/push`: one device.
    public static func devicePush(_ body: JSONValue, appID: String, deviceToken: String,
                                  jobID: String?) throws(ValidationError) -> PushJob {
        let token = try DeviceToken.normalized(deviceToken, field: "deviceToken")
        let fields = try FieldReader(body, allowed: ["tokenType", "environment", "payload", "pushType", "priority",
                                                     "expiration", "collapseId", "id"])
        let tokenType = try fields.enumeration("tokenType", TokenType.self) ?? .alert
        let environment = try fields.enumeration("environment", APNsEnvironment.self) ?? .production
        var job = PushJob(id: try jobIdentifier(fields, jobID), appId: appID,
                          target: .device(token, tokenType: tokenType, environment: environment))
        job.payload = try fields.requiredObject("payload")
        job.pushType = try fields.enumeration("pushType", APNsPushType.self)?.rawValue
        try common(fields, into: &job)
        try job.validate()
        return job
    }

    static let liveActivityFields: Set<String> = ["event", "contentState", "alert", "staleDate", "dismissalDate",
                                                   "relevanceScore"]

    private static func liveActivity(_ f: FieldReader) throws(ValidationError) -> PushJob.LiveActivity {
        guard let event = try f.enumeration("event", PushJob.LiveActivity.Event.self) else { throw .missing(f.name("event")) }
        return PushJob.LiveActivity(event: event, contentState: try f.requiredObject("contentState"),
                                    alert: try f.object("alert"),
                                    staleDate: try f.integer("staleDate", in: 0...Int64(UInt32.max)),
                                    dismissalDate: try f.integer("dismissalDate", in: 0...Int64(UInt32.max)),
                                    relevanceScore: try f.number("relevanceScore"),
                                    activityID: f.object.keys.contains("activityID") ? try f.string("activityID") : nil)
    }

    private static func common(_ f: FieldReader, into job: inout PushJob) throws(ValidationError) {
        job.priority = try f.integer("priority", in: 1...10).map(Int.init)
        job.expiration = try f.integer("expiration", in: 0...Int64(UInt32.max))
        job.collapseId = try f.string("collapseId")
    }

    /// The job id: the client's `id` (body) or `Idempotency-Key` (header), else a fresh random one. A malformed
    /// header is refused even when the body's `id` takes precedence, as the OpenAPI document says.
    private static func jobIdentifier(_ f: FieldReader, _ headerID: String?) throws(ValidationError) -> String {
        if let headerID { try checkJobID(headerID, field: "Idempotency-Key") }
        if let id = try f.string("id") {
            try checkJobID(id, field: "id")
            return id
        }
        return headerID ?? randomUUID()
    }

    /// A random (version 4) UUID in lowercase: Foundation's `UUID()` plus `uuidString` cost several percent of
    /// herald-ingest's CPU per event. OpenSSL's generator, not `SystemRandomNumberGenerator`: that makes a
    /// getrandom(2) call per 8 bytes.
    static func randomUUID() -> String {
        var bytes = SecureRandom.bytes(16)
        bytes[6] = bytes[6] & 0x0f | 0x40
        bytes[8] = bytes[8] & 0x3f | 0x80
        return UUIDText.string(UUID(bytes: bytes))
    }

    private static func checkJobID(_ id: String, field: String) throws(ValidationError) {
        guard !id.isEmpty, id.utf8.count <= 128, id.unicodeScalars.allSatisfy({ $0.value > 0x20 && $0.value < 0x7f }) else {
            throw .invalid(field, "\(field) must be 1–128 visible ASCII characters")
        }
    }
}
