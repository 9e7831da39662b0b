import Foundation
import HeraldCrypto
import HeraldRuntime
import Synchronization

/// The simulator's iOS 18 broadcast channels: per bundle id, each channel's storage policy, and how many devices
/// "joined" it (set by tests and benchmarks; a broadcast reaches that many). Shared by every connection.
public final class ChannelBook: Sendable {
    struct Channel: Sendable {
        var storagePolicy: Int
        var subscribers: Int
    }

    private let state = Lock<[String: [String: Channel]]>([:])
    private let broadcasts = Atomic<Int>(0)
    private let delivered = Atomic<Int>(0)
    /// Apple's cap: `CannotCreateChannelConfig` past it.
    let maximumPerBundle: Int
    let defaultSubscribers: Int

    init(maximumPerBundle: Int, defaultSubscribers: Int) {
        self.maximumPerBundle = maximumPerBundle
        self.defaultSubscribers = defaultSubscribers
    }

    /// A new channel's id (16 random bytes, base64 as Apple's), or nil when the bundle has its maximum.
    func create(bundle: String, storagePolicy: Int) -> String? {
        let id = Data(SecureRandom.bytes(16)).base64EncodedString()
        return state.withLock { books in
            guard books[bundle, default: [:]].count < maximumPerBundle else { return nil }
            books[bundle, default: [:]][id] = Channel(storagePolicy: storagePolicy, subscribers: defaultSubscribers)
            return id
        }
    }

    func channel(bundle: String, id: String) -> Channel? { state.withLock { $0[bundle]?[id] } }

    func delete(bundle: String, id: String) -> Bool {
        state.withLock { $0[bundle]?.removeValue(forKey: id) != nil }
    }

    /// A bundle's channel ids, sorted.
    public func ids(bundle: String) -> [String] { state.withLock { ($0[bundle]?.keys).map { $0.sorted() } ?? [] } }

    /// Sets how many devices a channel's broadcasts reach; false when there is no such channel.
    @discardableResult
    public func setSubscribers(_ count: Int, channelID: String) -> Bool {
        state.withLock { books in
            for bundle in books.keys where books[bundle]?[channelID] != nil {
                books[bundle]?[channelID]?.subscribers = count
                return true
            }
            return false
        }
    }

    func countBroadcast(reaching subscribers: Int) {
        broadcasts.add(1, ordering: .relaxed)
        delivered.add(subscribers, ordering: .relaxed)
    }

    /// Broadcasts accepted, and the devices they reached in all.
    public var broadcastCounts: (broadcasts: Int, devicesReached: Int) {
        (broadcasts.load(ordering: .relaxed), delivered.load(ordering: .relaxed))
    }
}

/// A broadcast that passed every check.
struct AcceptedBroadcast {
    var bundleID: String
    var channelID: String
    var priority: Int
    var expiration: Int64?
    var payload: JSONValue
    var subscribers: Int
}

/// Apple's rules for channel management (on the management listener) and for publishing broadcasts
/// (`/4/broadcasts/apps/<bundle>` on the push listener). Authentication is checked by the connection between
/// routing and these.
enum BroadcastValidator {
    enum Management {
        case create, read, delete, list
    }

    /// `/1/apps/<bundle>/channels` (POST, GET, DELETE) and `/1/apps/<bundle>/all-channels` (GET).
    static func managementRoute(_ request: IncomingRequest) -> Result<(Management, String), APNsRejection> {
        guard let path = request.path, path.hasPrefix("/1/apps/") else { return .failure(APNsRejection(404, "BadPath")) }
        let parts = path.dropFirst("/1/apps/".count).split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2, !parts[0].isEmpty else { return .failure(APNsRejection(404, "BadPath")) }
        let bundle = String(parts[0])
        switch (parts[1], request.method) {
        case ("channels", "POST"): return .success((.create, bundle))
        case ("channels", "GET"): return .success((.read, bundle))
        case ("channels", "DELETE"): return .success((.delete, bundle))
        case ("all-channels", "GET"): return .success((.list, bundle))
        case ("channels", _), ("all-channels", _): return .failure(APNsRejection(405, "MethodNotAllowed"))
        default: return .failure(APNsRejection(404, "BadPath"))
        }
    }

    /// The bundle of `POST /4/broadcasts/apps/<bundle>`.
    static func broadcastRoute(_ request: IncomingRequest) -> Result<String, APNsRejection> {
        guard let path = request.path, path.hasPrefix("/4/broadcasts/apps/") else {
            return .failure(APNsRejection(404, "BadPath"))
        }
        guard request.method == "POST" else { return .failure(APNsRejection(405, "MethodNotAllowed")) }
        let bundle = path.dropFirst("/4/broadcasts/apps/".count)
        guard !bundle.isEmpty, !bundle.contains("/") else { return .failure(APNsRejection(404, "BadPath")) }
        return .success(String(bundle))
    }

    /// Answers a management request: status, extra headers, body.
    static func manage(_ operation: Management, bundle: String, request: IncomingRequest, book: ChannelBook,
                       enabled: Bool) -> Result<(status: Int, headers: [(String, String)], body: [UInt8]?), APNsRejection> {
        guard enabled else { return .failure(APNsRejection(400, "FeatureNotEnabled")) }
        if let requestID = request.header("apns-request-id"), !RequestValidator.isCanonicalUUID(requestID) {
            return .failure(APNsRejection(400, "BadMessageId"))
        }
        switch operation {
        case .create:
            guard let body = JSONValue(parsing: request.body), let object = body.objectValue else {
                return .failure(APNsRejection(400, "BadRequestPayload"))
            }
            guard let pushType = object["push-type"] else { return .failure(APNsRejection(400, "MissingPushType")) }
            guard pushType.stringValue == "LiveActivity" else { return .failure(APNsRejection(400, "InvalidPushType")) }
            guard object.keys.allSatisfy({ ["push-type", "message-storage-policy"].contains($0) }),
                  let policy = object["message-storage-policy"]?.numberValue, policy == 0 || policy == 1 else {
                return .failure(APNsRejection(400, "BadRequestParams"))
            }
            guard let id = book.create(bundle: bundle, storagePolicy: Int(policy)) else {
                return .failure(APNsRejection(400, "CannotCreateChannelConfig"))
            }
            return .success((201, [("apns-channel-id", id)], nil))
        case .read, .delete:
            guard let id = request.header("apns-channel-id"), !id.isEmpty else {
                return .failure(APNsRejection(400, "MissingChannelId"))
            }
            guard isBase64(id) else { return .failure(APNsRejection(400, "BadChannelId")) }
            guard let channel = book.channel(bundle: bundle, id: id) else {
                return .failure(APNsRejection(400, "ChannelNotRegistered"))
            }
            if operation == .delete {
                _ = book.delete(bundle: bundle, id: id)
                return .success((204, [("apns-channel-id", id)], nil))
            }
            let body = JSONValue.object(["message-storage-policy": .number(Double(channel.storagePolicy)),
                                         "push-type": .string("LiveActivity")]).encoded()
            return .success((200, [("apns-channel-id", id)], body))
        case .list:
            let body = JSONValue.object(["channels": .array(book.ids(bundle: bundle).map { .string($0) })]).encoded()
            return .success((200, [], body))
        }
    }

    /// A broadcast's checks in the order Apple's test server applies them: channel id missing → push type
    /// missing → push type invalid → expiration → priority → channel unknown → payload empty → payload too
    /// large; a topic header is refused before all of them.
    static func broadcast(_ request: IncomingRequest, bundle: String, book: ChannelBook,
                          enabled: Bool) -> Result<AcceptedBroadcast, APNsRejection> {
        guard enabled else { return .failure(APNsRejection(400, "FeatureNotEnabled")) }
        if request.header("apns-topic") != nil { return .failure(APNsRejection(400, "TopicDisallowed")) }
        guard let id = request.header("apns-channel-id"), !id.isEmpty else {
            return .failure(APNsRejection(400, "MissingChannelId"))
        }
        guard isBase64(id) else { return .failure(APNsRejection(400, "BadChannelId")) }
        guard let pushType = request.header("apns-push-type") else { return .failure(APNsRejection(400, "MissingPushType")) }
        guard pushType == "liveactivity" else { return .failure(APNsRejection(400, "InvalidPushType")) }
        var expiration: Int64?
        if let raw = request.header("apns-expiration") {
            guard !raw.isEmpty, raw.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let value = Int64(raw) else {
                return .failure(APNsRejection(400, "BadExpirationDate"))
            }
            expiration = value
        }
        var priority = 10
        if let raw = request.header("apns-priority") {
            guard let value = Int(raw), [1, 5, 10].contains(value), String(value) == raw else {
                return .failure(APNsRejection(400, "BadPriority"))
            }
            priority = value
        }
        if let requestID = request.header("apns-request-id"), !RequestValidator.isCanonicalUUID(requestID) {
            return .failure(APNsRejection(400, "BadMessageId"))
        }
        guard let channel = book.channel(bundle: bundle, id: id) else {
            return .failure(APNsRejection(400, "ChannelNotRegistered"))
        }
        // A channel that stores nothing takes only messages that expire at once.
        if channel.storagePolicy == 0, expiration != 0 { return .failure(APNsRejection(400, "BadExpirationDate")) }
        if request.bodyLength == 0 { return .failure(APNsRejection(400, "PayloadEmpty")) }
        if request.bodyLength > RequestValidator.maximumBodyBytes { return .failure(APNsRejection(413, "PayloadTooLarge")) }
        guard let payload = JSONValue(parsing: request.body), case .object = payload,
              RequestValidator.payloadRules(payload, pushType: .liveactivity) == nil,
              payload["aps"]?["event"]?.stringValue != "start" else {
            // A broadcast updates or ends activities; it cannot start one.
            return .failure(APNsRejection(400, "BadRequestPayload"))
        }
        return .success(AcceptedBroadcast(bundleID: bundle, channelID: id, priority: priority, expiration: expiration,
                                          payload: payload, subscribers: channel.subscribers))
    }

    static func isBase64(_ text: String) -> Bool {
        text.utf8.count <= 256 && Data(base64Encoded: text) != nil
    }

    /// `{"time", "status": 200, "apnsRequestId", "bundleId", "channelId", "priority", "expiration", "payload",
    /// "subscribers", "connection"}` for `--record-broadcasts`.
    static func recordLine(_ broadcast: AcceptedBroadcast, requestID: String, time: Double, connection: Int) -> JSONValue {
        .object([
            "time": .number((time * 1000).rounded(.down)), "status": .number(200), "apnsRequestId": .string(requestID),
            "bundleId": .string(broadcast.bundleID), "channelId": .string(broadcast.channelID),
            "priority": .number(Double(broadcast.priority)),
            "expiration": broadcast.expiration.map { .number(Double($0)) } ?? .null, "payload": broadcast.payload,
            "subscribers": .number(Double(broadcast.subscribers)), "connection": .number(Double(connection)),
        ])
    }
}
