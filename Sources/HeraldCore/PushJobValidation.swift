import Foundation
import HeraldAPNsCore
import HeraldRuntime

/// The rules of the job format beyond its shape (which `decode` checks): what each target may carry, the
/// values' ranges, and that every payload Herald builds fits APNs' limit.
extension PushJob {
    /// 1–128 visible ASCII characters.
    public static func isValidID(_ id: String) -> Bool {
        !id.isEmpty && id.utf8.count <= 128 && id.unicodeScalars.allSatisfy { $0.value > 0x20 && $0.value < 0x7f }
    }

    /// Checks every rule of the job format, including the size of each payload Herald will build.
    public func validate() throws(ValidationError) {
        guard version == Self.currentVersion else { throw .invalid("version", "version must be \(Self.currentVersion)") }
        guard Self.isValidID(id) else { throw .invalid("id", "id must be 1–128 visible ASCII characters") }
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
        if broadcastChannel != nil, target.kind != .post {
            throw ValidationError(code: "invalid_field", message: "broadcastChannel belongs to post jobs", field: "broadcastChannel")
        }
        switch target {
        case .channel(let name):
            try Self.validateChannel(name, field: "target.channel")
            guard alert != nil || liveActivity != nil || start != nil else {
                throw ValidationError(code: "missing_field", message: "a channel job needs alert, liveActivity or start")
            }
            if let alert, priority == 10, APNsPayload.isBackgroundOnly(alert) {
                throw .invalid("priority", "an alert whose aps has only content-available is sent as a background push, "
                               + "which must use priority 5 or 1")
            }
            try rejectParts(payload: true, final: false)
        case .post(let hash):
            try PostIDHash.validate(hash, field: "target.postIdHash")
            guard (liveActivity != nil) != (broadcastChannel != nil) else {
                if broadcastChannel != nil {
                    throw ValidationError(code: "invalid_field", message: "a post job carries liveActivity or broadcastChannel, not both")
                }
                throw .missing("liveActivity")
            }
            guard alert == nil, start == nil else {
                throw ValidationError(code: "invalid_field", message: "a post job carries only liveActivity")
            }
            if broadcastChannel != nil, final != nil {
                throw ValidationError(code: "invalid_field", message: "final belongs to updates, not to broadcastChannel",
                                      field: "final")
            }
            try rejectParts(payload: true, final: false)
            if liveActivity?.activityID != nil {
                throw ValidationError(code: "invalid_field", message: "activityID belongs to channel jobs",
                                      field: "liveActivity.activityID")
            }
        case .device(let device):
            guard try DeviceToken.normalized(device.token, field: "target.deviceToken") == device.token else {
                throw .invalid("target.deviceToken", "target.deviceToken must be lowercase hex (it is part of the record key)")
            }
            if device.topic?.isEmpty == true { throw .invalid("target.topic", "target.topic must not be empty") }
            guard payload != nil else { throw .missing("payload") }
            guard alert == nil, liveActivity == nil, start == nil else {
                throw ValidationError(code: "invalid_field", message: "a device job carries its payload in payload")
            }
            try rejectParts(payload: false, final: true)
            if let pushType, APNsPushType(rawValue: pushType) == nil {
                throw .invalid("pushType", "pushType must be one of \(APNsPushType.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            if priority == 10, resolvedPushType == .background
                || (resolvedPushType == .alert && payload.map(APNsPayload.isBackgroundOnly) == true) {
                throw .invalid("priority", "background pushes, and any payload whose aps has only content-available, "
                               + "must use priority 5 or 1")
            }
        case .broadcast(let broadcast):
            guard APNsChannelID.isValid(broadcast.channelId) else {
                throw .invalid("target.channelId", "target.channelId must be a broadcast channel id (base64, at most \(APNsChannelID.maxLength) characters)")
            }
            guard payload != nil else { throw .missing("payload") }
            guard alert == nil, liveActivity == nil, start == nil else {
                throw ValidationError(code: "invalid_field", message: "a broadcast job carries its payload in payload")
            }
            if pushType != nil {
                throw ValidationError(code: "invalid_field", message: "a broadcast is always a liveactivity push", field: "pushType")
            }
            try rejectParts(payload: false, final: true)
        }
        // Apple takes a Live Activity push to a device at priority 10 or 5 only (a broadcast may use 1).
        if priority == 1, liveActivity != nil || start != nil || (target.kind == .device && resolvedPushType == .liveactivity) {
            throw .invalid("priority", "Live Activity pushes must use priority 10 or 5")
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
                if let value, !(0...Int64(UInt32.max)).contains(value) {
                    throw .invalid("liveActivity.\(name)", "liveActivity.\(name) must be UNIX seconds from 0 to \(UInt32.max)")
                }
            }
        }
        if let start {
            guard !start.attributesType.isEmpty else { throw .missing("start.attributesType") }
            for (name, value) in [("attributes", start.attributes), ("contentState", start.contentState), ("alert", start.alert)] {
                guard case .object = value else { throw .invalid("start.\(name)", "start.\(name) must be a JSON object") }
            }
            if let channel = start.inputPushChannel, !APNsChannelID.isValid(channel) {
                throw .invalid("start.inputPushChannel",
                               "start.inputPushChannel must be a broadcast channel id: 1–\(APNsChannelID.maxLength) base64 characters")
            }
        }
        if let payload { try APNsPayload.checkComplete(payload, field: "payload") }
        try checkSizes()
    }

    /// Device and broadcast jobs: the most bytes APNs takes in `payload`.
    public var payloadLimit: Int {
        if target.kind == .broadcast { return APNsPayload.maxBroadcastBytes }
        return resolvedPushType == .voip ? APNsPayload.maxVoIPBytes : APNsPayload.maxBytes
    }

    /// Device jobs: the push type to send. Without `pushType`: `liveactivity` for Live Activity tokens, else
    /// `background` for a payload that only wakes the app and `alert` for any other.
    public var resolvedPushType: APNsPushType {
        if let pushType, let type = APNsPushType(rawValue: pushType) { return type }
        guard target.tokenType == .alert || target.tokenType == nil else { return .liveactivity }
        return payload.map(APNsPayload.isBackgroundOnly) == true ? .background : .alert
    }

    /// A channel name as subscriptions take it, counted in Unicode scalars (as JSON Schema's `maxLength` counts).
    static func validateChannel(_ channel: String, field: String) throws(ValidationError) {
        guard channel.utf8.count <= Channel.maxLength || channel.unicodeScalars.count <= Channel.maxLength else {
            throw .invalid(field, "\(field) must be at most \(Channel.maxLength) characters")
        }
        try Channel.validate(channel, field: field)
    }

    private func rejectParts(payload rejectPayload: Bool, final rejectFinal: Bool) throws(ValidationError) {
        if rejectPayload, payload != nil || pushType != nil {
            throw ValidationError(code: "invalid_field", message: "payload and pushType belong to device jobs", field: "payload")
        }
        if rejectFinal, final != nil {
            throw ValidationError(code: "invalid_field", message: "final belongs to channel and post jobs", field: "final")
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
            let sent = target.kind == .device ? APNsPayload.sent(payload, pushType: resolvedPushType, timestamp: now) : payload
            built.append(("payload", sent.encoded(), payloadLimit))
        }
        for (field, bytes, limit) in built where bytes.count > limit {
            throw ValidationError(code: "payload_too_large",
                                  message: "the \(field) payload is \(bytes.count) bytes; APNs accepts at most \(limit)",
                                  field: field)
        }
    }
}
