import Foundation
import HeraldRuntime
import HeraldTLS

/// Where Redis is and how the client talks to it.
///
/// Build it from a URL, `redis[s]://[:password@|user:password@]host[:port][,host[:port]…][/db]` (or from the
/// `HERALD_REDIS_*` environment), then adjust the timeouts and pool size. `rediss://` connects through TLS. Several
/// hosts are seeds of a Redis Cluster: the client asks the first that answers for the others.
public struct RedisConfiguration: Sendable, Hashable, CustomStringConvertible {
    /// The URL used when none is configured.
    public static let defaultURL = "redis://127.0.0.1:6379/0"

    /// Host name or IP address (IPv6 without brackets) of the first seed.
    public var host: String
    /// TCP port of the first seed. Default 6379.
    public var port: Int
    /// Every seed, the first (`host`, `port`) included; more than one only for a Redis Cluster.
    public var seeds: [RedisAddress]
    /// Redis 6 ACL user; `nil` authenticates as the default user (`AUTH password`).
    public var username: String?
    /// Sent with `AUTH` on every new connection; `nil` sends no `AUTH`.
    public var password: String?
    /// Chosen with `SELECT` on every new connection (skipped for 0).
    public var database: Int
    /// How long opening a TCP connection (and `AUTH`/`SELECT`) may take. Default 2 s.
    public var connectTimeout: Duration
    /// How long a call may wait for its reply, counted from when it is queued. Default 2 s.
    public var commandTimeout: Duration
    /// Connections in the pool, each with its own thread. Default 4.
    public var poolSize: Int
    /// Commands that may wait for a connection before calls fail with `RedisError.Code.overloaded`. Default 65,536.
    public var maxQueuedCommands: Int
    /// TLS settings; `nil` talks in clear (`redis://`).
    public var tls: RedisTLS?

    public init(host: String = "127.0.0.1", port: Int = 6379, username: String? = nil, password: String? = nil,
                database: Int = 0, connectTimeout: Duration = .seconds(2), commandTimeout: Duration = .seconds(2),
                poolSize: Int = 4, maxQueuedCommands: Int = 65_536, tls: RedisTLS? = nil) {
        self.host = host
        self.port = port
        self.seeds = [RedisAddress(host: host, port: port)]
        self.username = username
        self.password = password
        self.database = database
        self.connectTimeout = connectTimeout
        self.commandTimeout = commandTimeout
        self.poolSize = max(1, poolSize)
        self.maxQueuedCommands = max(1, maxQueuedCommands)
        self.tls = tls
    }

    /// Parses `redis[s]://[:password@|user:password@]host[:port][/db]`; user and password may be percent-encoded.
    /// A `rediss://` URL uses `tls`, or the system's trust store when `tls` is nil.
    public init(url: String, tls: RedisTLS? = nil, connectTimeout: Duration = .seconds(2),
                commandTimeout: Duration = .seconds(2), poolSize: Int = 4,
                maxQueuedCommands: Int = 65_536) throws(RedisURLError) {
        let parsed = try RedisURLParser.parse(url)
        var secured: RedisTLS?
        if parsed.usesTLS {
            secured = tls
            if secured == nil {
                do throws(ConfigurationError) { secured = try RedisTLS() } catch { throw RedisURLError(.tls(error.message)) }
            }
        } else if tls != nil {
            // TLS files with a redis:// URL are a mistake that would send everything in clear.
            throw RedisURLError(.tlsSettingsWithoutTLS)
        }
        let first = parsed.seeds[0]
        self.init(host: first.host, port: first.port, username: parsed.username, password: parsed.password,
                  database: parsed.database, connectTimeout: connectTimeout, commandTimeout: commandTimeout,
                  poolSize: poolSize, maxQueuedCommands: maxQueuedCommands, tls: secured)
        seeds = parsed.seeds
    }

    /// This configuration for the node at `address` (a seed or a node the cluster named), credentials and TLS alike.
    func node(_ address: RedisAddress) -> RedisConfiguration {
        var configuration = self
        (configuration.host, configuration.port, configuration.seeds) = (address.host, address.port, [address])
        return configuration
    }

    /// The variables, for the executables' `--help`.
    public static let usage = """
      HERALD_REDIS_URL              redis[s]://[user:password@]host[:port][,host[:port]…][/db] [\(defaultURL)]
                                    (several hosts: seeds of a Redis Cluster)
      HERALD_REDIS_PASSWORD_FILE    a file holding the password (replaces the URL's)
      HERALD_REDIS_CA_FILE          with rediss://: CA bundle (PEM) trusted besides the system's
      HERALD_REDIS_CERT_FILE        and HERALD_REDIS_KEY_FILE: client certificate and key (tls-auth-clients)
    """

    /// From `HERALD_REDIS_URL`, with `HERALD_REDIS_PASSWORD_FILE` (replaces the URL's password) and, for a
    /// `rediss://` URL, `HERALD_REDIS_CA_FILE`, `HERALD_REDIS_CERT_FILE` and `HERALD_REDIS_KEY_FILE`.
    public init(environment env: EnvironmentReader, poolSize: Int = 4) throws(ConfigurationError) {
        let url = env.string("HERALD_REDIS_URL", default: Self.defaultURL)
        var tls: RedisTLS?
        let certificate = env.optionalString("HERALD_REDIS_CERT_FILE"), key = env.optionalString("HERALD_REDIS_KEY_FILE")
        let caFile = env.optionalString("HERALD_REDIS_CA_FILE")
        if caFile != nil || certificate != nil || key != nil {
            guard (certificate == nil) == (key == nil) else {
                throw ConfigurationError("HERALD_REDIS_CERT_FILE", "set both HERALD_REDIS_CERT_FILE and HERALD_REDIS_KEY_FILE, or neither")
            }
            do {
                tls = try RedisTLS(caFile: caFile, identity: certificate.map { ($0, key!) })
            } catch { throw ConfigurationError(caFile != nil ? "HERALD_REDIS_CA_FILE" : "HERALD_REDIS_CERT_FILE", error.message) }
        }
        do { try self.init(url: url, tls: tls, poolSize: poolSize) } catch {
            throw ConfigurationError("HERALD_REDIS_URL", "\(error)")
        }
        if let secret = try env.secretFile("HERALD_REDIS_PASSWORD_FILE") { password = secret }
        if let username, password == nil {
            throw ConfigurationError("HERALD_REDIS_URL", "names the user \(username) but no password: add it to the URL or set HERALD_REDIS_PASSWORD_FILE")
        }
    }

    /// The URL with any password masked: safe to log.
    public var description: String {
        var credentials = ""
        if password != nil { credentials = "\(username ?? ""):***@" }
        let hosts = seeds.map(\.description).joined(separator: ",")
        return "\(tls == nil ? "redis" : "rediss")://\(credentials)\(hosts)/\(database)"
    }
}

/// Where one Redis server listens.
public struct RedisAddress: Sendable, Hashable, CustomStringConvertible {
    /// Host name or IP address (IPv6 without brackets).
    public var host: String
    public var port: Int

    public init(host: String, port: Int) { (self.host, self.port) = (host, port) }

    /// `host:port`, an IPv6 address in brackets.
    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// How a `rediss://` connection is secured: the server's certificate is verified against the system's trust
/// store plus `caFile`, and its name against the URL's host; `identity` is the client certificate for a server
/// with `tls-auth-clients yes`. Verification cannot be turned off.
public struct RedisTLS: Sendable, Hashable {
    public let caFile: String?
    public let certificateFile: String?
    public let keyFile: String?
    /// Built once from the files, so a missing or bad file is reported at start, not on the first connection.
    let context: TLSContext

    public init(caFile: String? = nil, identity: (certificateChain: String, privateKey: String)? = nil) throws(ConfigurationError) {
        self.caFile = caFile
        certificateFile = identity?.certificateChain
        keyFile = identity?.privateKey
        context = try TLSContext.client(extraCAFile: caFile, alpn: [], identity: identity)
        // OpenSSL writes to the socket with write(2), not send(2) with MSG_NOSIGNAL: a peer's reset would
        // otherwise kill the process.
        signal(SIGPIPE, SIG_IGN)
    }

    public static func == (lhs: RedisTLS, rhs: RedisTLS) -> Bool {
        (lhs.caFile, lhs.certificateFile, lhs.keyFile) == (rhs.caFile, rhs.certificateFile, rhs.keyFile)
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(caFile)
        hasher.combine(certificateFile)
        hasher.combine(keyFile)
    }
}

/// A Redis URL that cannot be used, with the reason. Its text never contains the password.
public struct RedisURLError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Problem: Sendable, Hashable {
        /// Neither `redis://` nor `rediss://`.
        case unsupportedScheme(String)
        /// TLS files given with a `redis://` URL.
        case tlsSettingsWithoutTLS
        /// The TLS settings of a `rediss://` URL cannot be used.
        case tls(String)
        case missingHost
        /// Not a number in 1...65535.
        case invalidPort(String)
        /// Not a non-negative whole number.
        case invalidDatabase(String)
        /// Credentials not in the form `:password`, `user:password` or `user`, or a bad percent-escape.
        case invalidCredentials
        /// Something the format does not allow (a query, a fragment, a path after the database).
        case malformed(String)
    }

    public var problem: Problem

    public init(_ problem: Problem) { self.problem = problem }

    public var description: String {
        switch problem {
        case .unsupportedScheme(let scheme): return "Redis URL: scheme must be redis:// or rediss://, got \"\(scheme)\""
        case .tlsSettingsWithoutTLS:
            return "Redis URL: TLS files are set (HERALD_REDIS_CA_FILE, HERALD_REDIS_CERT_FILE) but the URL is redis://; use rediss://"
        case .tls(let message): return "Redis URL: TLS: \(message)"
        case .missingHost: return "Redis URL: the host is missing"
        case .invalidPort(let port): return "Redis URL: port must be a number in 1...65535, got \"\(port)\""
        case .invalidDatabase(let db): return "Redis URL: database must be a whole number ≥ 0, got \"\(db)\""
        case .invalidCredentials:
            return "Redis URL: credentials must be \":password@\", \"user:password@\" or \"user@\" (percent-encoded)"
        case .malformed(let what): return "Redis URL: \(what)"
        }
    }
}

enum RedisURLParser {
    struct Parsed {
        var seeds: [RedisAddress]
        var username: String?
        var password: String?
        var database = 0
        var usesTLS = false
    }

    static func parse(_ url: String) throws(RedisURLError) -> Parsed {
        guard let schemeEnd = url.range(of: "://") else { throw RedisURLError(.malformed("expected redis://host:port/db")) }
        let scheme = url[..<schemeEnd.lowerBound].lowercased()
        guard scheme == "redis" || scheme == "rediss" else { throw RedisURLError(.unsupportedScheme(scheme)) }
        var rest = url[schemeEnd.upperBound...]
        if rest.contains("?") || rest.contains("#") {
            throw RedisURLError(.malformed("query strings and fragments are not supported"))
        }

        var username: String?
        var password: String?
        // The last "@" ends the credentials: a password may contain "@" or "/" only percent-encoded, but be lenient,
        // and look for them before the database's "/", so no part of a password ends up in an error message.
        if let at = rest.lastIndex(of: "@") {
            let userInfo = rest[..<at]
            rest = rest[rest.index(after: at)...]
            // `user@` alone names the ACL user whose password comes from HERALD_REDIS_PASSWORD_FILE.
            let colon = userInfo.firstIndex(of: ":") ?? userInfo.endIndex
            guard let decodedUser = PercentDecoding.decode(userInfo[..<colon]) else { throw RedisURLError(.invalidCredentials) }
            if colon < userInfo.endIndex {
                guard let decodedPassword = PercentDecoding.decode(userInfo[userInfo.index(after: colon)...]) else {
                    throw RedisURLError(.invalidCredentials)
                }
                password = decodedPassword
            } else if decodedUser.isEmpty {
                throw RedisURLError(.invalidCredentials)
            }
            username = decodedUser.isEmpty ? nil : decodedUser
        }
        var databaseText: Substring = ""
        if let slash = rest.firstIndex(of: "/") {
            databaseText = rest[rest.index(after: slash)...]
            rest = rest[..<slash]
        }

        var seeds: [RedisAddress] = []
        for address in rest.split(separator: ",", omittingEmptySubsequences: false) {
            seeds.append(try parseAddress(address))
        }
        var parsed = Parsed(seeds: seeds, username: username, password: password, usesTLS: scheme == "rediss")
        if !databaseText.isEmpty {
            guard databaseText.allSatisfy(\.isASCII), let database = Int(databaseText), database >= 0 else {
                throw RedisURLError(.invalidDatabase(String(databaseText)))
            }
            parsed.database = database
        }
        return parsed
    }

    /// `host[:port]`, an IPv6 host in brackets.
    private static func parseAddress(_ text: Substring) throws(RedisURLError) -> RedisAddress {
        var host: Substring
        var portText: Substring?
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { throw RedisURLError(.malformed("unclosed \"[\" in the host")) }
            host = text[text.index(after: text.startIndex)..<close]
            let after = text[text.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { throw RedisURLError(.malformed("unexpected text after the host")) }
                portText = after.dropFirst()
            }
        } else if let colon = text.firstIndex(of: ":") {
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
        } else {
            host = text
        }
        guard !host.isEmpty else { throw RedisURLError(.missingHost) }
        var port = 6379
        if let portText {
            guard let number = Int(portText), (1...65535).contains(number) else {
                throw RedisURLError(.invalidPort(String(portText)))
            }
            port = number
        }
        return RedisAddress(host: String(host), port: port)
    }
}
