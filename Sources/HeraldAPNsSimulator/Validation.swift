import Foundation
import HeraldCrypto
import HeraldRuntime

/// An APNs error answer: HTTP status and `reason` (plus `timestamp` in ms for 410).
public struct APNsRejection: Error, Sendable, Equatable, CustomStringConvertible {
    /// HTTP status: 400, 403, 404, 405, 410, 413, 429, 500, 503.
    public var status: Int
    /// Apple's reason string, e.g. `BadDeviceToken`.
    public var reason: String
    /// For 410: when the token stopped being valid, in milliseconds since the epoch.
    public var timestamp: Int64?

    public init(_ status: Int, _ reason: String, timestamp: Int64? = nil) {
        self.status = status
        self.reason = reason
        self.timestamp = timestamp
    }

    /// The JSON body APNs sends: `{"reason": "..."}`, with `"timestamp"` for 410.
    public var body: [UInt8] {
        var fields: [String: JSONValue] = ["reason": .string(reason)]
        if let timestamp { fields["timestamp"] = .number(Double(timestamp)) }
        return JSONValue.object(fields).encoded()
    }

    public var description: String { "\(status) \(reason)" }
}

/// Apple's `apns-push-type` values and the topic suffix each one requires. An independent copy of HeraldAPNsCore's
/// on purpose: the stand-in checks what Apple documents, not what the client believes.
public enum APNsPushType: String, Sendable, CaseIterable {
    case alert, background, location, voip, complication, fileprovider, mdm, liveactivity, pushtotalk, widgets,
         controls

    /// What must end the `apns-topic` (after the bundle id); nil when the topic is the bare bundle id (or, for
    /// `mdm`, the MDM topic).
    public var topicSuffix: String? {
        switch self {
        case .alert, .background, .mdm: nil
        case .location: ".location-query"
        case .voip: ".voip"
        case .complication: ".complication"
        case .fileprovider: ".pushkit.fileprovider"
        case .liveactivity: ".push-type.liveactivity"
        case .pushtotalk: ".voip-ptt"
        case .widgets: ".push-type.widgets"
        case .controls: ".push-type.controls"
        }
    }

    /// The largest payload APNs accepts for this push type.
    public var maximumPayloadBytes: Int { self == .voip ? 5120 : 4096 }
}

/// A request as the HTTP/2 layer received it.
struct IncomingRequest {
    var method: String?
    var path: String?
    /// Regular (non-pseudo) header fields in arrival order, names lowercase (HTTP/2 requires it).
    var headers: [(name: String, value: String)] = []
    var body: [UInt8] = []
    /// The body's full length; `body` stops growing past the largest payload the simulator could accept.
    var bodyLength = 0

    func header(_ name: String) -> String? { headers.first { $0.name == name }?.value }
}

/// A push that passed every check.
struct AcceptedPush {
    var token: String
    var topic: String
    var pushType: APNsPushType
    var priority: Int
    var expiration: Int64?
    var collapseID: String?
    var payload: JSONValue
    /// The `iat` of the provider token it came with (seconds).
    var providerTokenIssuedAt: Double = 0
}

/// Apple's request rules, in the order the simulator applies them. Pure functions: no connection state.
enum RequestValidator {
    /// The smallest and largest device token, in bytes. Tokens were 32 bytes for years; Apple now documents
    /// that they can be longer, so up to 100 bytes are accepted.
    static let tokenBytes = 32...100
    static let maximumBodyBytes = 5120

    /// Method, path and device token: 405 MethodNotAllowed, 404 BadPath, 400 MissingDeviceToken/BadDeviceToken.
    static func route(_ request: IncomingRequest) -> Result<String, APNsRejection> {
        guard request.method == "POST" else { return .failure(APNsRejection(405, "MethodNotAllowed")) }
        guard let path = request.path else { return .failure(APNsRejection(404, "BadPath")) }
        guard path.hasPrefix("/3/device") else { return .failure(APNsRejection(404, "BadPath")) }
        var rest = path.dropFirst("/3/device".count)
        if rest.isEmpty { return .failure(APNsRejection(400, "MissingDeviceToken")) }
        guard rest.first == "/" else { return .failure(APNsRejection(404, "BadPath")) }
        rest = rest.dropFirst()
        if rest.isEmpty { return .failure(APNsRejection(400, "MissingDeviceToken")) }
        let token = String(rest)
        guard isHexToken(token) else { return .failure(APNsRejection(400, "BadDeviceToken")) }
        return .success(token.lowercased())
    }

    static func isHexToken(_ token: String) -> Bool {
        let utf8 = token.utf8
        guard utf8.count % 2 == 0, tokenBytes.contains(utf8.count / 2) else { return false }
        return utf8.allSatisfy(\.isHexDigit)
    }

    /// 400 DuplicateHeaders when a header field appears more than once.
    static func duplicates(_ request: IncomingRequest) -> APNsRejection? {
        // A request has a handful of headers: comparing pairs is cheaper than hashing them into a set.
        let headers = request.headers
        for index in headers.indices where headers[..<index].contains(where: { $0.name == headers[index].name }) {
            return APNsRejection(400, "DuplicateHeaders")
        }
        return nil
    }

    /// Everything after authentication: topic, push type, priority, expiration, collapse id, apns-id, payload.
    /// `mayUse` says whether the provider token may push to a bundle id (400 TopicDisallowed if not), `isListed`
    /// whether a topic is itself a configured bundle id.
    static func notification(_ request: IncomingRequest, token: String, mayUse: (String) -> Bool,
                             isListed: (String) -> Bool) -> Result<AcceptedPush, APNsRejection> {
        guard let topic = request.header("apns-topic"), !topic.isEmpty else {
            return .failure(APNsRejection(400, "MissingTopic"))
        }
        guard isWellFormedTopic(topic) else { return .failure(APNsRejection(400, "BadTopic")) }
        guard let rawType = request.header("apns-push-type"), let pushType = APNsPushType(rawValue: rawType) else {
            return .failure(APNsRejection(400, "InvalidPushType"))
        }
        guard let bundle = bundleID(of: topic, for: pushType, isListed: isListed) else {
            return .failure(APNsRejection(400, "InvalidPushType"))
        }
        guard mayUse(bundle) else { return .failure(APNsRejection(400, "TopicDisallowed")) }

        var priority = 10
        if let raw = request.header("apns-priority") {
            guard let value = Int(raw), [1, 5, 10].contains(value), String(value) == raw else {
                return .failure(APNsRejection(400, "BadPriority"))
            }
            priority = value
        }
        // Apple: background pushes must use priority 5 (or 1); 10, also the default, is an error.
        if pushType == .background, priority == 10 { return .failure(APNsRejection(400, "BadPriority")) }
        // A Live Activity push to a device: 10 or 5 (only broadcasts take 1).
        if pushType == .liveactivity, priority == 1 { return .failure(APNsRejection(400, "BadPriority")) }

        var expiration: Int64?
        if let raw = request.header("apns-expiration") {
            guard !raw.isEmpty, raw.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let value = Int64(raw) else {
                return .failure(APNsRejection(400, "BadExpirationDate"))
            }
            expiration = value
        }

        let collapseID = request.header("apns-collapse-id")
        if let collapseID, collapseID.utf8.count > 64 { return .failure(APNsRejection(400, "BadCollapseId")) }
        if let id = request.header("apns-id"), !isCanonicalUUID(id) {
            return .failure(APNsRejection(400, "BadMessageId"))
        }

        if request.bodyLength == 0 { return .failure(APNsRejection(400, "PayloadEmpty")) }
        if request.bodyLength > pushType.maximumPayloadBytes { return .failure(APNsRejection(413, "PayloadTooLarge")) }
        guard let payload = JSONValue(parsing: request.body), case .object = payload else {
            return .failure(APNsRejection(400, "BadPayload"))
        }
        if let rejection = payloadRules(payload, pushType: pushType) { return .failure(rejection) }
        // Apple: "It is an error to use this priority [10] for a push notification that contains only the
        // content-available key."
        if priority == 10, pushType == .alert, let aps = payload["aps"]?.objectValue, onlyWakesTheApp(aps) {
            return .failure(APNsRejection(400, "BadPriority"))
        }

        return .success(AcceptedPush(token: token, topic: topic, pushType: pushType, priority: priority,
                                     expiration: expiration, collapseID: collapseID, payload: payload))
    }

    /// A topic is a reverse-DNS bundle id, optionally with a push-type suffix: no spaces or control characters,
    /// no empty labels.
    static func isWellFormedTopic(_ topic: String) -> Bool {
        guard topic.utf8.count <= 255 else { return false }
        // Two or more non-empty labels between dots; one pass, as this runs for every push.
        var labels = 1, labelLength = 0
        for c in topic.utf8 {
            if c == UInt8(ascii: ".") {
                guard labelLength > 0 else { return false }
                labels += 1
                labelLength = 0
            } else {
                guard (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A)
                    || c == UInt8(ascii: "-") || c == UInt8(ascii: "_") else { return false }
                labelLength += 1
            }
        }
        return labels >= 2 && labelLength > 0
    }

    /// The bundle id behind `topic` for `pushType`, or nil when the topic's suffix does not match the push type
    /// (a Live Activity push to a bare bundle id, an alert push to a `.voip` topic, …). A topic `isListed` as a
    /// bundle id of its own is one, whatever it ends with (`com.example.voip`).
    static func bundleID(of topic: String, for pushType: APNsPushType, isListed: (String) -> Bool) -> String? {
        if let suffix = pushType.topicSuffix {
            guard topic.hasSuffix(suffix), topic.utf8.count > suffix.utf8.count else { return nil }
            return String(topic.utf8.dropLast(suffix.utf8.count))
        }
        if pushType == .mdm { return topic }
        let carriesOtherSuffix = APNsPushType.allCases.contains { other in
            other.topicSuffix.map { topic.hasSuffix($0) } ?? false
        }
        return carriesOtherSuffix && !isListed(topic) ? nil : topic
    }

    /// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` in lowercase hex, as Apple documents for `apns-id`.
    static func isCanonicalUUID(_ text: String) -> Bool {
        let bytes = Array(text.utf8)
        guard bytes.count == 36 else { return false }
        for (index, c) in bytes.enumerated() {
            if [8, 13, 18, 23].contains(index) {
                guard c == UInt8(ascii: "-") else { return false }
            } else {
                guard (c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66) else { return false }
            }
        }
        return true
    }

    /// A fresh lowercase (version 4) UUID: for responses to requests without a (valid) `apns-id`, and for
    /// `apns-unique-id`.
    static func newAPNsID() -> String {
        // RAND_bytes rather than Foundation's UUID(), which opens /dev/urandom on every call here.
        var bytes = SecureRandom.bytes(16)
        bytes[6] = bytes[6] & 0x0F | 0x40
        bytes[8] = bytes[8] & 0x3F | 0x80
        return UUIDText.string(UUID(bytes: bytes))
    }

    /// `content-available: 1` and no alert, badge or sound: what a background push must be, and what Apple
    /// refuses at priority 10.
    static func onlyWakesTheApp(_ aps: [String: JSONValue]) -> Bool {
        aps["content-available"]?.numberValue == 1 && aps["alert"] == nil && aps["badge"] == nil && aps["sound"] == nil
    }

    /// Payload rules per push type. APNs documents no reason for a malformed payload; the simulator answers
    /// 400 `BadPayload` (clients treat an unknown 400 reason as permanent).
    static func payloadRules(_ payload: JSONValue, pushType: APNsPushType) -> APNsRejection? {
        let bad = APNsRejection(400, "BadPayload")
        switch pushType {
        case .alert:
            guard payload["aps"]?.objectValue != nil else { return bad }
        case .background:
            guard let aps = payload["aps"]?.objectValue, onlyWakesTheApp(aps) else { return bad }
        case .liveactivity:
            guard let aps = payload["aps"]?.objectValue, aps["timestamp"]?.numberValue != nil,
                  let event = aps["event"]?.stringValue else { return bad }
            switch event {
            case "update", "end":
                guard aps["content-state"]?.objectValue != nil else { return bad }
            case "start":
                guard aps["content-state"]?.objectValue != nil, aps["attributes-type"]?.stringValue != nil,
                      aps["attributes"]?.objectValue != nil else { return bad }
                // iOS 18 inputs: a broadcast channel id for the started activity to join; 1 asks it for an update
                // token (0 for none).
                if let channel = aps["input-push-channel"], channel.stringValue == nil { return bad }
                if let token = aps["input-push-token"], ![0, 1].contains(token.numberValue) { return bad }
            default:
                return bad
            }
            for key in ["stale-date", "dismissal-date", "relevance-score"] {
                if let value = aps[key], value.numberValue == nil { return bad }
            }
        case .location, .voip, .complication, .fileprovider, .mdm, .pushtotalk, .widgets, .controls:
            break
        }
        return nil
    }
}
