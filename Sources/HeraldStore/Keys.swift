import HeraldCrypto

/// Redis key layout. Every key starts `herald:`; an app's keys share the hash tag `{<app>}` so that the Lua
/// scripts that touch a subscription and its indexes run in one slot on Redis Cluster.
///
/// | key | type | what |
/// | --- | --- | --- |
/// | `herald:{app}:sub:<id>` | hash | one subscription |
/// | `herald:{app}:ch:<channel>` | set | ids of the channel's subscriptions |
/// | `herald:{app}:dev:<token>` | set | ids of the token's subscriptions |
/// | `herald:{app}:act:<id>` | hash, TTL | one Live Activity registration |
/// | `herald:{app}:post:<hash>` | zset, TTL | registration ids of a post, scored by expiry (ms) |
/// | `herald:{app}:acttok:<token>` | zset, TTL | registration ids of a push token, scored by expiry (ms) |
/// | `herald:{app}:idem:<id>` | string, 24 h | idempotency marker of a producer request |
/// | `herald:{app}:rl:<key>:<window>` | counter, 61 s | fixed-window rate limit of one API key or OAuth subject |
public struct RedisKeys: Sendable {
    public let app: String
    /// `herald:{app}:`, passed to scripts that derive index keys from stored fields.
    public let prefix: String

    public init(app: String) {
        self.app = app
        self.prefix = "herald:{\(app)}:"
    }

    public func subscription(_ id: String) -> String { prefix + "sub:" + id }
    public func channel(_ name: String) -> String { prefix + "ch:" + name }
    public func device(_ token: String) -> String { prefix + "dev:" + token }
    public func registration(_ id: String) -> String { prefix + "act:" + id }
    public func post(_ hash: String) -> String { prefix + "post:" + hash }
    public func activityToken(_ token: String) -> String { prefix + "acttok:" + token }
    public func idempotency(_ id: String) -> String { prefix + "idem:" + id }
    public func rateLimit(_ key: String, window: Int) -> String { prefix + "rl:" + key + ":" + String(window) }

    /// A stable 24-hex-digit id from the parts that make a record unique.
    static func identifier(_ parts: String...) -> String {
        String(Hex.encode(SHA256.hash(parts.joined(separator: "\n"))).prefix(24))
    }
}
