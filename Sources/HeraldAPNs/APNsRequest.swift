@_exported import HeraldAPNsCore
import Foundation
import HeraldRuntime

/// Why a request was refused before it reached the network.
public enum APNsRequestProblem: Sendable, Equatable, CustomStringConvertible {
    /// The device token is empty, too long, or not hexadecimal.
    case invalidDeviceToken
    /// The topic is empty or contains characters a header cannot carry.
    case invalidTopic
    /// APNs refuses an empty payload (400 PayloadEmpty).
    case payloadEmpty
    /// The payload exceeds the push type's limit (APNs would answer 413 PayloadTooLarge).
    case payloadTooLarge(size: Int, limit: Int)
    /// The collapse id exceeds 64 bytes (APNs would answer 400 BadCollapseId).
    case collapseIDTooLong(size: Int)
    /// The collapse id is empty or contains characters a header cannot carry.
    case invalidCollapseID
    /// A broadcast channel id is empty, too long or not base64.
    case invalidChannelID

    public var description: String {
        switch self {
        case .invalidDeviceToken: "device token must be 1–200 hexadecimal characters"
        case .invalidTopic: "topic must be a non-empty header value"
        case .payloadEmpty: "payload is empty"
        case .payloadTooLarge(let size, let limit): "payload is \(size) bytes, the limit is \(limit)"
        case .collapseIDTooLong(let size): "collapse id is \(size) bytes, the limit is 64"
        case .invalidCollapseID: "collapse id must be a non-empty header value"
        case .invalidChannelID: "channel id must be 1–256 base64 characters"
        }
    }
}

/// One notification for one device: `POST /3/device/<deviceToken>` with APNs headers and a JSON payload.
public struct APNsRequest: Sendable {
    /// Payload limit for every push type but VoIP.
    public static let maximumPayloadSize = 4096
    /// Payload limit for VoIP pushes.
    public static let maximumVoIPPayloadSize = 5120
    /// `apns-collapse-id` limit in bytes.
    public static let maximumCollapseIDSize = 64

    /// The device (or Live Activity) token, hexadecimal; sent lowercased.
    public var deviceToken: String
    public var pushType: APNsPushType
    /// The `apns-topic`: the bundle id, or `<bundle id>.push-type.liveactivity` and the like.
    public var topic: String
    /// The JSON payload bytes.
    public var payload: [UInt8]
    /// `nil` means 10, or 5 for background pushes (which Apple requires).
    public var priority: APNsPriority?
    /// When APNs may stop trying to deliver; `Date(timeIntervalSince1970: 0)` means deliver once, don't store.
    /// `nil` sends no `apns-expiration` header.
    public var expiration: Date?
    /// `apns-collapse-id`, at most 64 bytes.
    public var collapseID: String?
    /// `apns-id`; APNs generates one when absent and returns it either way.
    public var apnsID: UUID?

    public init(deviceToken: String, pushType: APNsPushType, topic: String, payload: [UInt8],
                priority: APNsPriority? = nil, expiration: Date? = nil, collapseID: String? = nil,
                apnsID: UUID? = nil) {
        self.deviceToken = deviceToken
        self.pushType = pushType
        self.topic = topic
        self.payload = payload
        self.priority = priority
        self.expiration = expiration
        self.collapseID = collapseID
        self.apnsID = apnsID
    }

    /// The `apns-priority` actually sent.
    public var effectivePriority: APNsPriority {
        priority ?? (pushType == .background ? .powerConsiderate : .immediate)
    }

    /// The payload size limit for this push type.
    public var payloadLimit: Int {
        pushType == .voip ? Self.maximumVoIPPayloadSize : Self.maximumPayloadSize
    }

    /// Checks everything APNs would refuse that can be known without asking it.
    public func validate() throws(APNsError) {
        guard (1...200).contains(deviceToken.utf8.count), Self.allBytes(of: deviceToken, satisfy: \.isHexDigit) else {
            throw APNsError(.invalidRequest(.invalidDeviceToken), "invalid device token")
        }
        guard !topic.isEmpty, Self.isHeaderValue(topic) else {
            throw APNsError(.invalidRequest(.invalidTopic), "invalid topic")
        }
        guard !payload.isEmpty else { throw APNsError(.invalidRequest(.payloadEmpty), "payload is empty") }
        guard payload.count <= payloadLimit else {
            let problem = APNsRequestProblem.payloadTooLarge(size: payload.count, limit: payloadLimit)
            throw APNsError(.invalidRequest(problem), problem.description)
        }
        if let collapseID {
            let size = collapseID.utf8.count
            guard size <= Self.maximumCollapseIDSize else {
                throw APNsError(.invalidRequest(.collapseIDTooLong(size: size)), "collapse id is \(size) bytes")
            }
            guard size > 0, Self.isHeaderValue(collapseID) else {
                throw APNsError(.invalidRequest(.invalidCollapseID), "invalid collapse id")
            }
        }
    }

    /// Visible ASCII and spaces only: no CR/LF or other control bytes that could split a header.
    private static func isHeaderValue(_ value: String) -> Bool {
        allBytes(of: value) { $0 >= 0x20 && $0 != 0x7F }
    }

    /// Checks the UTF-8 bytes in place (this runs for every push; iterating `String.UTF8View` costs several times
    /// more than a buffer).
    private static func allBytes(of text: String, satisfy predicate: (UInt8) -> Bool) -> Bool {
        if let result = text.utf8.withContiguousStorageIfAvailable({ $0.allSatisfy(predicate) }) { return result }
        return text.utf8.allSatisfy(predicate)
    }
}
