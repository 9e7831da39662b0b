import HeraldRuntime
/// Where Redis is and how the client talks to it.
///
/// Build it from a URL, `redis://[:password@|user:password@]host[:port][/db]`, then adjust the timeouts and pool
/// size. hiredis 0.14 has no TLS, so `rediss://` is refused rather than silently sent in clear text.
public struct RedisConfiguration: Sendable, Hashable, CustomStringConvertible {
    /// The URL used when none is configured.
    public static let defaultURL = "redis://127.0.0.1:6379/0"

    /// Host name or IP address (IPv6 without brackets).
    public var host: String
    /// TCP port. Default 6379.
    public var port: Int
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

    public init(host: String = "127.0.0.1", port: Int = 6379, username: String? = nil, password: String? = nil,
                database: Int = 0, connectTimeout: Duration = .seconds(2), commandTimeout: Duration = .seconds(2),
                poolSize: Int = 4, maxQueuedCommands: Int = 65_536) {
        self.host = host
        self.port = port
        self.username = username
        self.password = password
        self.database = database
        self.connectTimeout = connectTimeout
        self.commandTimeout = commandTimeout
        self.poolSize = max(1, poolSize)
        self.maxQueuedCommands = max(1, maxQueuedCommands)
    }

    /// Parses `redis://[:password@|user:password@]host[:port][/db]`; user and password may be percent-encoded.
    public init(url: String, connectTimeout: Duration = .seconds(2), commandTimeout: Duration = .seconds(2),
                poolSize: Int = 4, maxQueuedCommands: Int = 65_536) throws(RedisURLError) {
        let parsed = try RedisURLParser.parse(url)
        self.init(host: parsed.host, port: parsed.port, username: parsed.username, password: parsed.password,
                  database: parsed.database, connectTimeout: connectTimeout, commandTimeout: commandTimeout,
                  poolSize: poolSize, maxQueuedCommands: maxQueuedCommands)
    }

    /// The URL with any password masked: safe to log.
    public var description: String {
        var credentials = ""
        if password != nil { credentials = "\(username ?? ""):***@" }
        let hostText = host.contains(":") ? "[\(host)]" : host
        return "redis://\(credentials)\(hostText):\(port)/\(database)"
    }
}

/// A Redis URL that cannot be used, with the reason. Its text never contains the password.
public struct RedisURLError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Problem: Sendable, Hashable {
        /// Not `redis://` (`rediss://` included: hiredis 0.14 has no TLS).
        case unsupportedScheme(String)
        case missingHost
        /// Not a number in 1...65535.
        case invalidPort(String)
        /// Not a non-negative whole number.
        case invalidDatabase(String)
        /// Credentials not in the form `:password` or `user:password`, or a bad percent-escape.
        case invalidCredentials
        /// Something the format does not allow (a query, a fragment, a path after the database).
        case malformed(String)
    }

    public var problem: Problem

    public init(_ problem: Problem) { self.problem = problem }

    public var description: String {
        switch problem {
        case .unsupportedScheme(let scheme):
            return scheme == "rediss"
                ? "Redis URL: TLS (rediss://) is not supported by this client (hiredis 0.14); use redis://"
                : "Redis URL: scheme must be redis://, got \"\(scheme)\""
        case .missingHost: return "Redis URL: the host is missing"
        case .invalidPort(let port): return "Redis URL: port must be a number in 1...65535, got \"\(port)\""
        case .invalidDatabase(let db): return "Redis URL: database must be a whole number ≥ 0, got \"\(db)\""
        case .invalidCredentials:
            return "Redis URL: credentials must be \":password@\" or \"user:password@\" (percent-encoded)"
        case .malformed(let what): return "Redis URL: \(what)"
        }
    }
}

enum RedisURLParser {
    struct Parsed {
        var host: String
        var port = 6379
        var username: String?
        var password: String?
        var database = 0
    }

    static func parse(_ url: String) throws(RedisURLError) -> Parsed {
        guard let schemeEnd = url.range(of: "://") else { throw RedisURLError(.malformed("expected redis://host:port/db")) }
        let scheme = url[..<schemeEnd.lowerBound].lowercased()
        guard scheme == "redis" else { throw RedisURLError(.unsupportedScheme(scheme)) }
        var rest = url[schemeEnd.upperBound...]
        if rest.contains("?") || rest.contains("#") {
            throw RedisURLError(.malformed("query strings and fragments are not supported"))
        }

        var databaseText: Substring = ""
        if let slash = rest.firstIndex(of: "/") {
            databaseText = rest[rest.index(after: slash)...]
            rest = rest[..<slash]
        }

        var username: String?
        var password: String?
        // The last "@" ends the credentials: a password may contain "@" only percent-encoded, but be lenient.
        if let at = rest.lastIndex(of: "@") {
            let userInfo = rest[..<at]
            rest = rest[rest.index(after: at)...]
            guard let colon = userInfo.firstIndex(of: ":") else { throw RedisURLError(.invalidCredentials) }
            let user = userInfo[..<colon]
            guard let decodedUser = PercentDecoding.decode(user),
                  let decodedPassword = PercentDecoding.decode(userInfo[userInfo.index(after: colon)...]) else {
                throw RedisURLError(.invalidCredentials)
            }
            username = decodedUser.isEmpty ? nil : decodedUser
            password = decodedPassword
        }

        var host: Substring
        var portText: Substring?
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { throw RedisURLError(.malformed("unclosed \"[\" in the host")) }
            host = rest[rest.index(after: rest.startIndex)..<close]
            let after = rest[rest.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { throw RedisURLError(.malformed("unexpected text after the host")) }
                portText = after.dropFirst()
            }
        } else if let colon = rest.firstIndex(of: ":") {
            host = rest[..<colon]
            portText = rest[rest.index(after: colon)...]
        } else {
            host = rest
        }
        guard !host.isEmpty else { throw RedisURLError(.missingHost) }

        var parsed = Parsed(host: String(host), username: username, password: password)
        if let portText {
            guard let port = Int(portText), (1...65535).contains(port) else {
                throw RedisURLError(.invalidPort(String(portText)))
            }
            parsed.port = port
        }
        if !databaseText.isEmpty {
            guard databaseText.allSatisfy(\.isASCII), let database = Int(databaseText), database >= 0 else {
                throw RedisURLError(.invalidDatabase(String(databaseText)))
            }
            parsed.database = database
        }
        return parsed
    }
}
