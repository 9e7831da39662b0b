import Foundation
import HeraldRuntime

/// How an `APNsSimulator` listens, whom it trusts and what it records.
public struct APNsSimulatorConfiguration: Sendable {
    /// Where to listen; port 0 picks a free port (read it back from `APNsSimulator.port`).
    public var listen: HostPort
    /// PEM certificate chain the server presents (server certificate first).
    public var certificateChainPath: String
    /// PEM private key of the server certificate.
    public var privateKeyPath: String
    /// Provider token keys the simulator accepts.
    public var providerKeys: [ProviderKey]
    /// Bundle ids pushes may target (the topic without its push-type suffix); empty accepts any bundle id.
    public var allowedTopics: Set<String>
    /// Bundle ids that belong to particular teams: only those teams' provider tokens may push to them (else 400
    /// TopicDisallowed) or manage their channels (403 TopicMismatch), as with Apple, where a key pushes only to
    /// its own team's apps. Bundle ids not listed here take any team's tokens. See `allowTopics(_:)`.
    public var topicOwners: [String: Set<String>] = [:]
    /// Programmed failures at start (the rules file, when given, replaces them).
    public var rules: [SimulatorRule]
    /// A rules file (`{"rules": [...]}`), re-read when it changes. See `SimulatorRule`.
    public var rulesPath: String?
    /// Where to append one JSON line per accepted push. See `RecordLine`.
    public var recordPath: String?
    /// Where to append one JSON line per rejected request.
    public var rejectedRecordPath: String?
    /// SETTINGS_MAX_CONCURRENT_STREAMS once a connection used a valid provider token (1 before, as APNs does).
    public var maxConcurrentStreams: Int
    /// Every answer waits this long before it is sent (a random time in the range), as Apple's round trip of tens
    /// of milliseconds does; nil answers at once. A rule's own `delayMs` takes its place for the pushes it matches.
    public var responseDelay: ClosedRange<Duration>?
    /// Provider tokens older than this get 403 ExpiredProviderToken. Default one hour.
    public var providerTokenMaximumAge: Duration
    /// `iat` further than this in the future gets 403 InvalidProviderToken. Default 60 s.
    public var providerTokenClockSkew: Duration
    /// A connection switching to a token issued less than this after its previous one gets 429
    /// TooManyProviderTokenUpdates. Default 20 minutes.
    public var providerTokenMinimumRefresh: Duration
    /// Time a client has to finish the TLS handshake. Default 10 s.
    public var handshakeTimeout: Duration
    /// A connection with nothing to do for this long is closed (GOAWAY first). Default 1 hour.
    public var idleTimeout: Duration
    /// A connection whose peer reads nothing for this long while output is pending is dropped. Default 30 s.
    public var writeTimeout: Duration
    /// Connections beyond this are closed at once. Default 256.
    public var maxConnections: Int
    /// How often counters are logged (when they changed). Default 10 s.
    public var statisticsInterval: Duration
    /// Where the channel management API (iOS 18 broadcast) listens; nil: not served.
    public var manageListen: HostPort?
    /// Bundle ids without the Broadcast capability: their channel requests and broadcasts get 400
    /// FeatureNotEnabled.
    public var broadcastDisabledBundles: Set<String> = []
    /// Channels per bundle id; creating one more gets 400 CannotCreateChannelConfig. Apple's cap is 10,000.
    public var maxChannelsPerBundle = 10_000
    /// How many devices a new channel reaches until `ChannelBook.setSubscribers` says otherwise.
    public var channelSubscribers = 0
    /// Where to append one JSON line per accepted broadcast.
    public var broadcastRecordPath: String?
    /// Answers as Apple's development environment does, with an `apns-unique-id` on every response; false: as
    /// production, without. Default true.
    public var development = true

    public init(listen: HostPort, certificateChainPath: String, privateKeyPath: String,
                providerKeys: [ProviderKey], allowedTopics: Set<String> = [], rules: [SimulatorRule] = [],
                rulesPath: String? = nil, recordPath: String? = nil, rejectedRecordPath: String? = nil,
                maxConcurrentStreams: Int = 1000, responseDelay: ClosedRange<Duration>? = nil,
                providerTokenMaximumAge: Duration = .seconds(3600),
                providerTokenClockSkew: Duration = .seconds(60),
                providerTokenMinimumRefresh: Duration = .seconds(20 * 60),
                handshakeTimeout: Duration = .seconds(10), idleTimeout: Duration = .seconds(3600),
                writeTimeout: Duration = .seconds(30), maxConnections: Int = 256,
                statisticsInterval: Duration = .seconds(10)) {
        self.listen = listen
        self.certificateChainPath = certificateChainPath
        self.privateKeyPath = privateKeyPath
        self.providerKeys = providerKeys
        self.allowedTopics = allowedTopics
        self.rules = rules
        self.rulesPath = rulesPath
        self.recordPath = recordPath
        self.rejectedRecordPath = rejectedRecordPath
        self.maxConcurrentStreams = maxConcurrentStreams
        self.responseDelay = responseDelay
        self.providerTokenMaximumAge = providerTokenMaximumAge
        self.providerTokenClockSkew = providerTokenClockSkew
        self.providerTokenMinimumRefresh = providerTokenMinimumRefresh
        self.handshakeTimeout = handshakeTimeout
        self.idleTimeout = idleTimeout
        self.writeTimeout = writeTimeout
        self.maxConnections = maxConnections
        self.statisticsInterval = statisticsInterval
    }
}

extension APNsSimulatorConfiguration {
    /// Adds `BUNDLE_ID` (any team may push to it) or `TEAMID:BUNDLE_ID` (only that team may) to the allowed topics.
    public mutating func allowTopics(_ specifications: [String]) throws(ConfigurationError) {
        for specification in specifications {
            let parts = specification.split(separator: ":", omittingEmptySubsequences: false).map(String.init)
            guard (1...2).contains(parts.count), !parts.contains(where: \.isEmpty) else {
                throw ConfigurationError("topic", "expected BUNDLE_ID or TEAMID:BUNDLE_ID, got \"\(specification)\"")
            }
            let bundle = parts[parts.count - 1]
            allowedTopics.insert(bundle)
            if parts.count == 2 { topicOwners[bundle, default: []].insert(parts[0]) }
        }
    }

    /// Whether pushes may address `bundle`: any bundle id when none is listed. A listed bundle id covers its
    /// extensions' too (`com.example.shop.widget` under `com.example.shop`), as an app's key pushes to every
    /// bundle of its team.
    func allows(_ bundle: String) -> Bool {
        allowedTopics.isEmpty || Self.listed(bundle, in: allowedTopics) != nil
    }

    /// False when `bundle` (or the bundle id it extends) belongs to teams other than `team`.
    func team(_ team: String, owns bundle: String) -> Bool {
        guard let owned = Self.listed(bundle, in: topicOwners.keys) else { return true }
        return topicOwners[owned]!.contains(team)
    }

    /// Whether a provider token of `team` may push to `bundle`.
    func team(_ team: String, mayUse bundle: String) -> Bool {
        allows(bundle) && self.team(team, owns: bundle)
    }

    /// `bundle`, or the longest of `list` that `bundle` extends (`a.b` for `a.b.c`); nil when none.
    private static func listed(_ bundle: String, in list: some Collection<String>) -> String? {
        if list.contains(bundle) { return bundle }
        return list.filter { bundle.hasPrefix($0 + ".") }.max { $0.utf8.count < $1.utf8.count }
    }
}

/// The simulator's JSON configuration file: keys and topics, for setups with more than a flag's worth.
///
/// ```json
/// {"keys": [{"teamId": "TEAM123456", "keyId": "KEY1234567", "path": "keys/shop.p8"}],
///  "topics": ["TEAM123456:com.example.shop", "com.example.anyteam"]}
/// ```
/// `path` is relative to the file's folder and may name a `.p8`, a public key or a certificate. A topic is
/// `BUNDLE_ID` or `TEAMID:BUNDLE_ID` (see `allowTopics(_:)`).
public struct SimulatorConfigFile: Sendable {
    public var keys: [ProviderKey]
    public var topics: [String]

    public init(path: String) throws(ConfigurationError) {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw ConfigurationError("config", "cannot read \(path)")
        }
        guard let document = try? JSONDecoder().decode(JSONValue.self, from: data), let object = document.objectValue else {
            throw ConfigurationError("config", "\(path) is not a JSON object")
        }
        if let unknown = object.keys.first(where: { !["keys", "topics"].contains($0) }) {
            throw ConfigurationError("config", "\(path): unknown key \"\(unknown)\"")
        }
        let directory = (path as NSString).deletingLastPathComponent
        var keys: [ProviderKey] = []
        for (index, entry) in (object["keys"]?.arrayValue ?? []).enumerated() {
            guard let team = entry["teamId"]?.stringValue, let keyID = entry["keyId"]?.stringValue,
                  let keyPath = entry["path"]?.stringValue else {
                throw ConfigurationError("config", "\(path): keys[\(index)] needs teamId, keyId and path")
            }
            keys.append(try ProviderKey(teamID: team, keyID: keyID, path: keyPath,
                                        relativeTo: directory.isEmpty ? "." : directory))
        }
        var topics: [String] = []
        for entry in object["topics"]?.arrayValue ?? [] {
            guard let topic = entry.stringValue, !topic.isEmpty else {
                throw ConfigurationError("config", "\(path): topics must be non-empty strings")
            }
            topics.append(topic)
        }
        self.keys = keys
        self.topics = topics
    }
}
