import HeraldCrypto

/// Redis key layout. Every key starts `herald:`; an app's keys share the hash tag `{<app>}` so that the Lua
/// scripts that touch a subscription and its indexes run in one slot on Redis Cluster.
///
/// | key | type | what |
/// | --- | --- | --- |
/// | `herald:{app}:sub:<id>` | hash | one subscription |
/// | `herald:{app}:ch:<channel>` | hash | subscription id → what a push needs of it (`ChannelTarget.encoded`) |
/// | `herald:{app}:dev:<token>` | set | ids of the token's subscriptions |
/// | `herald:{app}:subexp` | zset | subscription ids by expiry (UNIX seconds), for the sweep |
/// | `herald:{app}:act:<id>` | hash, TTL | one Live Activity registration: createdAt, user, postIdHash, pushToken, environment, bundleId, lastSeenMs |
/// | `herald:{app}:post:<hash>` | zset, TTL | registration ids of a post, scored by expiry (ms) |
/// | `herald:{app}:acttok:<token>` | zset, TTL | registration ids of a push token, scored by expiry (ms) |
/// | `herald:{app}:bcast:<hash>` | hash | a post's broadcast channels: `<environment>` → channel JSON, `<environment>:refused` → APNs' last refusal (`BroadcastChannelStore`) |
/// | `herald:{app}:bcastidx` | zset | posts with broadcast channels, scored by their last create or update (ms), for the janitor |
/// | `herald:{app}:bcastorphan` | hash | `<environment>:<channelId>` → when the janitor first saw the channel at APNs but not in Redis (ms) |
/// | `herald:{app}:idem:<id>` | string, 24 h | idempotency marker of a producer request |
/// | `herald:{app}:rl:<key>:<window>` | counter, 61 s | fixed-window rate limit of one API key or OAuth subject |
/// | `herald:{app}:job:<id>` | hash, 24 h | a job's status: acceptedAt, target, startedAt, finishedAt, counts (`JobStatusStore`) |
/// | `herald:{app}:fanout:<group>:<topic>:<partition>:<offset>` | hash, TTL | a job record's fan-out progress (the dispatcher's `FanOutProgress`) |
public struct RedisKeys: Sendable {
    public let app: String
    /// `herald:{app}:`, passed to scripts that derive index keys from stored fields.
    public let prefix: String

    public init(app: String) {
        self.app = app
        self.prefix = "herald:{" + app + "}:"
    }

    public func subscription(_ id: String) -> String { key("sub:", id) }
    public func channel(_ name: String) -> String { key("ch:", name) }
    public func device(_ token: String) -> String { key("dev:", token) }
    public var subscriptionExpiry: String { prefix + "subexp" }
    public func registration(_ id: String) -> String { key("act:", id) }
    public func post(_ hash: String) -> String { key("post:", hash) }
    public func activityToken(_ token: String) -> String { key("acttok:", token) }
    public func broadcast(_ postIDHash: String) -> String { key("bcast:", postIDHash) }
    public var broadcastIndex: String { prefix + "bcastidx" }
    public var broadcastOrphans: String { prefix + "bcastorphan" }
    public func idempotency(_ id: String) -> String { key("idem:", id) }
    public func rateLimit(_ key: String, window: Int) -> String { self.key("rl:", key, suffix: ":" + String(window)) }
    public func jobStatus(_ id: String) -> String { key("job:", id) }
    /// In the app's slot with the job's status, which one script updates with it.
    public func fanOut(group: String, topic: String, partition: Int32, offset: Int64) -> String {
        key("fanout:", group, suffix: ":\(topic):\(partition):\(offset)")
    }

    /// `prefix + kind + name + suffix` in one allocation: chained `+` builds a string per step, and every request
    /// of the hot endpoints builds four or five keys.
    private func key(_ kind: String, _ name: String, suffix: String = "") -> String {
        var text = ""
        text.reserveCapacity(prefix.utf8.count + kind.utf8.count + name.utf8.count + suffix.utf8.count)
        text += prefix
        text += kind
        text += name
        text += suffix
        return text
    }

    /// A stable 24-hex-digit id from the parts that make a record unique: the first 12 bytes, in hex, of the
    /// SHA-256 of the parts joined by newlines. Built in one byte buffer and hexed straight from the digest (no
    /// joined string, full-length hex or prefix copy: this runs for every subscription and registration).
    static func identifier(_ parts: String...) -> String {
        var text: [UInt8] = []
        text.reserveCapacity(parts.reduce(parts.count) { $0 + $1.utf8.count })
        for (index, part) in parts.enumerated() {
            if index > 0 { text.append(UInt8(ascii: "\n")) }
            text += part.utf8
        }
        return Hex.encode(SHA256.hash(text).prefix(12))
    }
}
