import Foundation
import HeraldCrypto
import HeraldRuntime

/// An APNs server address parsed from `https://host[:port]`.
public struct APNsEndpoint: Sendable, Hashable, CustomStringConvertible {
    public let host: String
    public let port: UInt16

    /// Apple's own hosts: only the system trust store vouches for them, never `extraCAFile`.
    public static let appleHosts: Set<String> = ["api.push.apple.com", "api.sandbox.push.apple.com",
                                                 "api.development.push.apple.com",
                                                 "api-manage-broadcast.push.apple.com",
                                                 "api-manage-broadcast.sandbox.push.apple.com",
                                                 "api-broadcast.push.apple.com", "api-broadcast.sandbox.push.apple.com"]

    /// True for one of Apple's APNs hosts (any port, any case).
    public var isApple: Bool { Self.appleHosts.contains(host.lowercased()) }

    public init(host: String, port: UInt16 = 443) {
        self.host = host
        self.port = port
        let hostPart = host.utf8.contains(UInt8(ascii: ":")) ? "[\(host)]" : host
        authority = port == 443 ? hostPart : "\(hostPart):\(port)"
    }

    /// Parses `https://host[:port]` (IPv6 literals in brackets). Plain `http` is refused: APNs is TLS only.
    public init(url: String) throws(APNsError) {
        guard url.hasPrefix("https://") else {
            throw APNsError(.invalidConfiguration, "APNs URL must start with https:// (got \(url))")
        }
        var rest = Substring(url.dropFirst("https://".count))
        if rest.hasSuffix("/") { rest = rest.dropLast() }
        var host: Substring
        var portText: Substring?
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else {
                throw APNsError(.invalidConfiguration, "unterminated IPv6 literal in \(url)")
            }
            host = rest[rest.index(after: rest.startIndex)..<close]
            let after = rest[rest.index(after: close)...]
            if after.hasPrefix(":") { portText = after.dropFirst() }
            else if !after.isEmpty { throw APNsError(.invalidConfiguration, "unexpected text after host in \(url)") }
        } else if let colon = rest.lastIndex(of: ":") {
            host = rest[..<colon]
            portText = rest[rest.index(after: colon)...]
        } else {
            host = rest
        }
        guard !host.isEmpty, !host.contains("/") else {
            throw APNsError(.invalidConfiguration, "APNs URL must be https://host[:port] (got \(url))")
        }
        var port: UInt16 = 443
        if let portText {
            guard let parsed = UInt16(portText), parsed > 0 else {
                throw APNsError(.invalidConfiguration, "invalid port in \(url)")
            }
            port = parsed
        }
        self.init(host: String(host), port: port)
    }

    /// The `:authority` pseudo-header.
    public private(set) var authority: String

    public var description: String { "https://" + authority }
}

/// A provider-token signing identity: Apple team id, key id and the `.p8` private key.
public struct APNsCredentials: Sendable {
    public var teamID: String
    public var keyID: String
    public var privateKey: PrivateKey

    public init(teamID: String, keyID: String, privateKey: PrivateKey) {
        self.teamID = teamID
        self.keyID = keyID
        self.privateKey = privateKey
    }
}

/// How the APNs client connects. Defaults follow Apple's guidance; tests shorten the times.
public struct APNsConfiguration: Sendable {
    /// `https://host[:port]` of production APNs.
    public var productionURL = "https://api.push.apple.com"
    /// `https://host[:port]` of sandbox APNs.
    public var sandboxURL = "https://api.sandbox.push.apple.com"
    /// Where broadcasts to iOS 18 channels are published; nil: the push host (`productionURL`, `sandboxURL`).
    public var broadcastProductionURL: String?
    public var broadcastSandboxURL: String?
    /// Apple's channel management hosts.
    public var manageProductionURL = "https://api-manage-broadcast.push.apple.com:2196"
    public var manageSandboxURL = "https://api-manage-broadcast.sandbox.push.apple.com:2195"
    /// An extra PEM file of trusted roots, added to the system trust store for the configured hosts that are not
    /// Apple's (the simulator's CA): a certificate it signed for Apple's hosts is never accepted. Verification
    /// itself cannot be turned off.
    public var extraCAFile: String?
    /// Host name → address to connect to instead of resolving it, or several separated by commas (as
    /// `curl --resolve`): TLS still sends and verifies the host name. For tests of how a host is trusted, and for
    /// pinning egress addresses.
    public var addressOverrides: [String: String] = [:]
    /// Connections kept open per (provider key, endpoint).
    public var connectionsPerEndpoint = 2
    /// Longest delay between opening successive connections of one pool; each opens as soon as the one before
    /// is ready, so connects never come in bursts (Apple treats rapid connects as an attack).
    public var connectionStagger: Duration = .milliseconds(500)
    /// Time for one request, queueing included; on expiry its stream is reset and it fails as `.timeout`.
    public var requestTimeout: Duration = .seconds(10)
    /// Time to connect, finish TLS and receive the server's SETTINGS.
    public var connectTimeout: Duration = .seconds(10)
    /// Time for one address to accept the TCP connection before the next address is tried (the last one tried
    /// has what is left of `connectTimeout`): an address that drops packets (IPv6 without a working route) costs
    /// this, not the whole connect. Long enough for one lost SYN to be sent again.
    public var addressConnectTimeout: Duration = .seconds(3)
    /// A connection that received nothing for this long is sent a PING (as is one whose request timed out).
    public var pingInterval: Duration = .seconds(15)
    /// A PING unanswered for this long closes the connection (its requests fail as retryable).
    public var pingTimeout: Duration = .seconds(10)
    /// First reconnect delay after a failure; doubles per consecutive failure up to `reconnectMaximumDelay`.
    public var reconnectInitialDelay: Duration = .milliseconds(500)
    public var reconnectMaximumDelay: Duration = .seconds(30)
    /// A pool (provider key, endpoint) that sent nothing for this long closes its connections and is forgotten: a
    /// key replaced by rotation, or an app gone quiet. Its next request opens a new pool.
    public var idlePoolLifetime: Duration = .seconds(3600)
    /// Requests waiting for a free stream per pool; beyond it `send` fails fast with `.queueFull`.
    public var maximumQueuedRequests = 10_000
    /// Our own cap on streams per connection, below the server's SETTINGS_MAX_CONCURRENT_STREAMS.
    public var maximumStreamsPerConnection = 1000
    /// How long one provider token is used: every process signing with the key uses the same token for the same
    /// window (see `APNsProviderTokenCache`). Apple refuses tokens older than an hour.
    public var providerTokenWindow: Duration = .seconds(30 * 60)
    /// A provider token is never re-signed sooner than this after the last one (Apple answers 429
    /// TooManyProviderTokenUpdates otherwise).
    public var providerTokenMinimumInterval: Duration = .seconds(20 * 60)

    public init() {}
}

extension APNsConfiguration {
    /// Where APNs is, from `HERALD_APNS_*` (the dispatcher's and `heraldctl send --direct`'s settings): the push,
    /// broadcast and channel management URLs (each checked to be `https://host[:port]`) and the extra CA file
    /// (checked to be readable).
    public init(environment env: EnvironmentReader) throws(ConfigurationError) {
        self.init()
        productionURL = env.string("HERALD_APNS_PRODUCTION_URL", default: productionURL)
        sandboxURL = env.string("HERALD_APNS_SANDBOX_URL", default: sandboxURL)
        broadcastProductionURL = env.optionalString("HERALD_APNS_BROADCAST_PRODUCTION_URL")
        broadcastSandboxURL = env.optionalString("HERALD_APNS_BROADCAST_SANDBOX_URL")
        manageProductionURL = env.string("HERALD_APNS_MANAGE_PRODUCTION_URL", default: manageProductionURL)
        manageSandboxURL = env.string("HERALD_APNS_MANAGE_SANDBOX_URL", default: manageSandboxURL)
        let urls = [("HERALD_APNS_PRODUCTION_URL", productionURL), ("HERALD_APNS_SANDBOX_URL", sandboxURL),
                    ("HERALD_APNS_BROADCAST_PRODUCTION_URL", broadcastProductionURL ?? productionURL),
                    ("HERALD_APNS_BROADCAST_SANDBOX_URL", broadcastSandboxURL ?? sandboxURL),
                    ("HERALD_APNS_MANAGE_PRODUCTION_URL", manageProductionURL),
                    ("HERALD_APNS_MANAGE_SANDBOX_URL", manageSandboxURL)]
        for (name, url) in urls {
            do { _ = try APNsEndpoint(url: url) } catch { throw ConfigurationError(name, "\(error)") }
        }
        extraCAFile = env.optionalString("HERALD_APNS_CA_FILE")
        if let file = extraCAFile, !FileManager.default.isReadableFile(atPath: file) {
            throw ConfigurationError("HERALD_APNS_CA_FILE", "cannot read \(file)")
        }
    }
}
