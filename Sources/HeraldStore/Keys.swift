import HeraldCrypto

/// Redis key layout (version `RedisLayout.current`). Every key starts `herald:`. The hash tag of a key (the part in
/// braces, which picks its Redis Cluster slot) names one entity, not the app, so an app's subscriptions and
/// registrations spread over every master of a cluster: what one script touches shares one tag, and an operation
/// that spans entities runs as ordered steps (see `SubscriptionStore` and `ActivityStore`). Keys of the app as a whole, and those that are
/// small and short-lived (broadcast channels, idempotency markers, jobs), carry the app's tag `{app}`.
///
/// | key | type | what |
/// | --- | --- | --- |
/// | `herald:{app:d:<token>}:sub:<id>` | hash | one subscription, in its device's slot |
/// | `herald:{app:d:<token>}:dev` | set | ids of the token's subscriptions |
/// | `herald:{app:d:<token>}:gone:v` | hash, 30 min | `<id>` → the version (`updatedMs`) a cluster removal deleted, below which the subscription's next version does not start |
/// | `herald:{app:c:<channel>}:ch` | hash | subscription id → what a push needs of it (`ChannelTarget.encoded`) |
/// | `herald:{app:c:<channel>}:gone:<n>` | hash, 30 min | `<id>` → the highest `updatedMs` of each subscription a cluster removal took from the channel index in the n-th ten minutes |
/// | `herald:{app:e:<n>}:subexp` | zset | `<id><token>` by expiry (UNIX seconds), for the sweep; n = the id's first byte mod 64 |
/// | `herald:{app:k:<credential>}:rl:<window>` | counter, 61 s | fixed-window rate limit of one API key or OAuth subject |
/// | `herald:{app:d:<token>}:rl:<credential>:<window>` | counter, 61 s | the same for one device behind a public key (`a:` for a Live Activity push token) |
/// | `herald:{app:p:<hash>}:act:<id>` | hash, TTL | one Live Activity registration, in its post's slot: createdAt, user, postIdHash, pushToken, environment, bundleId, lastSeenMs |
/// | `herald:{app:p:<hash>}:post` | zset, TTL | registration ids of a post, scored by expiry (ms) |
/// | `herald:{app:a:<token>}:acttok` | zset, TTL | `<id><postIdHash>` of a push token's registrations, scored by expiry (ms) |
/// | `herald:{app}:bcast:<hash>` | hash | a post's broadcast channels: `<environment>` → channel JSON, `<environment>:refused` → APNs' last refusal (`BroadcastChannelStore`) |
/// | `herald:{app}:bcastidx` | zset | posts with broadcast channels, scored by their last create or update (ms), for the janitor |
/// | `herald:{app}:bcastenv` | set | the environments the app asked APNs for a channel in, for the janitor's lists |
/// | `herald:{app}:bcastorphan` | hash | `<environment>:<channelId>` → when the janitor first saw the channel at APNs but not in Redis (ms) |
/// | `herald:{app}:idem:<id>` | string, 24 h | idempotency marker of a producer request |
/// | `herald:{app}:job:<id>` | hash, 24 h | a job's status: acceptedAt, target, startedAt, finishedAt, counts (`JobStatusStore`) |
/// | `herald:{app}:fanout:<group>:<topic>:<partition>:<offset>:<jobId>` | hash, TTL | a job record's fan-out progress (the dispatcher's `FanOutProgress`) |
/// | `herald:layout` | string | the layout version (`RedisLayout`) |
public struct RedisKeys: Sendable {
    public let app: String
    /// `herald:{app}:`, passed to scripts that derive index keys from stored fields.
    public let prefix: String

    public init(app: String) {
        self.app = app
        self.prefix = "herald:{" + app + "}:"
    }

    public func subscription(_ id: String, token: String) -> String { entity("d:", token, "}:sub:" + id) }
    public func device(_ token: String) -> String { entity("d:", token, "}:dev") }
    public func channel(_ name: String) -> String { entity("c:", name, "}:ch") }
    /// The versions of a device's subscriptions a cluster removal deleted (`<id>` → `updatedMs`), kept as long as the
    /// channel's removal markers, so a subscription made again gets a later version whatever its pod's clock says.
    public func removedVersions(_ token: String) -> String { entity("d:", token, "}:gone:v") }
    /// The highest subscription version (`<id>` → `updatedMs`) a cluster removal took out of a channel's index in one
    /// span of `removalSpan` seconds (`bucket` = UNIX seconds / span), which an upsert of that version or an older
    /// one must not put back.
    public func channelRemovals(_ name: String, bucket: Int64) -> String {
        entity("c:", name, "}:gone:" + String(bucket))
    }
    /// How long one key of removal markers collects them; each lives three spans, and an upsert looks in the span
    /// before and after its own too, so clocks of different pods may be up to a span apart.
    public static let removalSpan: Int64 = 600
    /// How many keys the expiry index is split into, so it spreads over a cluster's masters as evenly as the rest.
    public static let expiryBuckets = 64
    public func subscriptionExpiry(bucket: Int) -> String { entity("e:", String(bucket), "}:subexp") }
    /// The expiry index holding subscription `id`: its first byte (two hex digits) modulo the bucket count.
    public func subscriptionExpiry(id: String) -> String {
        subscriptionExpiry(bucket: (Int(id.prefix(2), radix: 16) ?? 0) % Self.expiryBuckets)
    }
    /// Whose slot a device's rate-limit counter lives in: the entity the request writes first, so that the script
    /// writing it counts the request.
    public enum DeviceCounterSlot: String, Sendable {
        /// A subscription's device token (`d:`).
        case deviceToken = "d:"
        /// A Live Activity push token (`a:`).
        case activityToken = "a:"
    }

    /// A rate-limit counter of `credential` for `window`, in the credential's slot; with `device`, of that device
    /// behind it, in `slot`.
    public func rateLimit(_ credential: String, device: String? = nil, in slot: DeviceCounterSlot = .deviceToken,
                          window: Int) -> String {
        guard let device else { return entity("k:", credential, "}:rl:" + String(window)) }
        return entity(slot.rawValue, device, "}:rl:" + credential + ":" + String(window))
    }
    public func registration(_ id: String, post: String) -> String { entity("p:", post, "}:act:" + id) }
    public func post(_ hash: String) -> String { entity("p:", hash, "}:post") }
    public func activityToken(_ token: String) -> String { entity("a:", token, "}:acttok") }
    public func broadcast(_ postIDHash: String) -> String { key("bcast:", postIDHash) }
    public var broadcastIndex: String { prefix + "bcastidx" }
    public var broadcastOrphans: String { prefix + "bcastorphan" }
    public var broadcastEnvironments: String { prefix + "bcastenv" }
    public func idempotency(_ id: String) -> String { key("idem:", id) }
    public func jobStatus(_ id: String) -> String { key("job:", id) }
    /// In the app's slot with the job's status, which one script updates with it. The job id makes it the record's
    /// own: a topic created again starts its offsets over, and another job at the same offset must not resume it.
    public func fanOut(group: String, topic: String, partition: Int32, offset: Int64, job: String) -> String {
        key("fanout:", group, suffix: ":\(topic):\(partition):\(offset):\(job)")
    }

    /// `herald:{<app>:<kind><name><rest>` (rest closes the tag) in one allocation.
    private func entity(_ kind: String, _ name: String, _ rest: String) -> String {
        var text = ""
        text.reserveCapacity(9 + app.utf8.count + kind.utf8.count + name.utf8.count + rest.utf8.count)
        text += "herald:{"
        text += app
        text += ":"
        text += kind
        text += name
        text += rest
        return text
    }

    /// `prefix + kind + name + suffix` in one allocation: chained `+` builds a string per step, and every request
    /// of the hot endpoints builds four or five keys (so does `entity`).
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
