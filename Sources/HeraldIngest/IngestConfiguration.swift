import HeraldCore
import HeraldHTTP
import HeraldRuntime

/// Settings of herald-ingest. The executable fills it from `HERALD_*` variables (see README).
public struct IngestConfiguration: Sendable {
    /// `HERALD_INGEST_ADDR`.
    public var address: HostPort = HostPort(host: "127.0.0.1", port: 8080)
    /// `HERALD_INGEST_ADMIN_ADDR`: when set, `/metrics` (with `/healthz` and `/readyz`) is served there and not
    /// on the API's address.
    public var adminAddress: HostPort?
    /// `HERALD_RATE_LIMIT_PER_MINUTE`: requests per fixed 60 s window of one credential (secret key, OAuth
    /// subject), or of one device token behind a public key.
    public var rateLimitPerMinute = 240
    /// `HERALD_APP_RATE_LIMIT_PER_MINUTE`: requests per window of one public key across all its devices.
    public var appRateLimitPerMinute = 600_000
    /// `HERALD_ACTIVITY_TTL_SECONDS`: a Live Activity registration lives this long after its last re-post.
    public var activityTTL: Duration = .seconds(3600)
    /// `HERALD_JOB_STATUS_TTL_SECONDS`: a job's status can be read this long after its last update.
    public var jobStatusTTL: Duration = .seconds(86_400)
    /// `HERALD_MAX_SUBSCRIPTIONS_PER_DEVICE`: a device token's subscriptions; a new one past it gets 409.
    public var maxSubscriptionsPerDevice = 500
    /// `HERALD_SUBSCRIPTION_TTL_DAYS`: a subscription not renewed (re-subscribed) for this long ends; nil: never.
    public var subscriptionTTL: Duration? = .seconds(90 * 86_400)
    /// `HERALD_MAX_BODY_BYTES`.
    public var maxBodyBytes = 65_536
    /// `HERALD_TOPIC_JOBS`.
    public var jobsTopic = "herald.jobs"
    /// How job records are signed. The executable requires `HERALD_JOB_SIGNING_SECRET_FILE` or an explicit
    /// `HERALD_JOB_SIGNATURES=unverified`.
    public var jobSigning: JobSigning = .unverified
    /// How long a producer request waits for the broker's acknowledgement before answering 503.
    public var publishTimeout: Duration = .seconds(5)
    /// `HERALD_BROADCAST_CHANNEL_WAIT_SECONDS`: how long a broadcast channel request waits for the dispatcher to
    /// make the channel at APNs.
    public var broadcastChannelWait: Duration = .seconds(10)
    /// `HERALD_HTTP_THREADS`: HTTP worker loops, each a thread with its own epoll set and Redis connection; about
    /// one per core the process may use.
    public var threads = 2
    /// `HERALD_HTTP_IDLE_TIMEOUT_SECONDS`: a connection with no traffic either way for this long is closed.
    public var idleTimeout: Duration = .seconds(30)
    /// `HERALD_HTTP_READ_TIMEOUT_SECONDS`: a whole request must arrive within this long of its connection opening
    /// or of the previous response, however slowly it trickles.
    public var readTimeout: Duration = .seconds(30)
    /// `HERALD_HTTP_MAX_CONNECTIONS`: open connections; more wait in the accept queue.
    public var maxConnections = 1024
    /// `HERALD_HTTP_MAX_CONNECTIONS_PER_IP`: open connections per client address; 0 = unlimited.
    public var maxConnectionsPerAddress = 0
    /// `HERALD_HTTP_IPV6_PREFIX_LENGTH`: IPv6 clients share the per-address limit per network of this prefix.
    public var ipv6PrefixLength = 64
    /// `HERALD_ACCESS_LOG`: one line per request at info level.
    public var accessLog = true
    /// Clock skew allowed when checking OAuth tokens' `exp` and `nbf`.
    public var clockSkew: Duration = .seconds(60)

    public init() {}

    var http: HTTPServerConfiguration {
        let requestDeadline = max(publishTimeout, broadcastChannelWait) + .seconds(2)
        // On SIGTERM a request under way may take its whole deadline (a broadcast waiting for its channel).
        return HTTPServerConfiguration(address: address, threads: threads, maxBodyBytes: maxBodyBytes,
                                       connectionTimeout: idleTimeout, requestReadTimeout: readTimeout,
                                       maxConnections: maxConnections, maxConnectionsPerAddress: maxConnectionsPerAddress,
                                       ipv6PrefixLength: ipv6PrefixLength,
                                       requestDeadline: requestDeadline, shutdownGracePeriod: requestDeadline + .seconds(1),
                                       accessLog: accessLog)
    }
}
