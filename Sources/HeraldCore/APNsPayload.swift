import HeraldRuntime

/// Builds the APNs payloads Herald sends.
public enum APNsPayload {
    public static let maxBytes = 4096
    public static let maxVoIPBytes = 5120
    /// Broadcasts to an iOS 18 channel.
    public static let maxBroadcastBytes = 5120

    /// A complete payload: a JSON object with an `aps` object (custom keys beside it are kept).
    static func checkComplete(_ payload: JSONValue, field: String) throws(ValidationError) {
        guard case .object(let object) = payload else { throw .invalid(field, "\(field) must be a JSON object") }
        guard case .object = object["aps"] else { throw .invalid(field, "\(field) must have an \"aps\" object") }
    }

    /// A payload that only wakes the app: its `aps` has `content-available: 1` and no alert, badge or sound.
    /// Apple takes it as a background push, at priority 5 or 1 (10 is an error for it).
    public static func isBackgroundOnly(_ payload: JSONValue) -> Bool {
        guard case .object(let aps)? = payload["aps"], aps["content-available"] == .number(1) else { return false }
        return aps["alert"] == nil && aps["badge"] == nil && aps["sound"] == nil
    }

    /// A Live Activity payload as sent: `aps.timestamp` added when the producer left it out (Apple drops updates
    /// without it). Other payloads as they are.
    public static func sent(_ payload: JSONValue, pushType: APNsPushType, timestamp: Int64) -> JSONValue {
        guard pushType == .liveactivity, case .object(var root) = payload, case .object(var aps)? = root["aps"],
              aps["timestamp"] == nil else { return payload }
        aps["timestamp"] = .number(Double(timestamp))
        root["aps"] = .object(aps)
        return .object(root)
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
        var aps: [String: JSONValue] = [
            "timestamp": .number(Double(timestamp)),
            "event": .string("start"),
            "content-state": content.contentState,
            "attributes-type": .string(content.attributesType),
            "attributes": content.attributes,
            "alert": content.alert,
        ]
        if let channel = content.inputPushChannel { aps["input-push-channel"] = .string(channel) }
        // Apple takes the number 1; `false` asks for nothing, so nothing is sent.
        if content.inputPushToken == true { aps["input-push-token"] = .number(1) }
        return .object(["aps": .object(aps)])
    }
}
