import HeraldRuntime

/// Answers one request. Runs with the worker loop that read the request as its preferred executor; it may await
/// I/O. Throw `HTTPError` to answer with an error body; anything else thrown becomes 500 `internal_error`.
public typealias HTTPHandler = @Sendable (HTTPRequest) async throws -> HTTPResponse

/// What a route accepts as a body.
public enum RequestBody: Sendable {
    /// No check: the handler reads `body` as it likes (or ignores it).
    case any
    /// `Content-Type` must be `application/json` (parameters such as `charset` allowed), else 415.
    case json
}

/// Method + path-pattern routing. Patterns are literal segments and `{name}` parameters:
/// `/v1/apps/{appID}/activities/{postIdHash}/events`. A path that matches no pattern is 404; a path that matches
/// only under other methods is 405 with `Allow`. When two patterns match a path, the one added first wins.
public struct Router: Sendable {
    struct Route: Sendable {
        var method: HTTPMethod
        var pattern: String
        var segments: [Segment]
        var body: RequestBody
        var handler: HTTPHandler
    }

    enum Segment: Sendable, Equatable {
        case literal(String)
        case parameter(String)
    }

    enum Match: Sendable {
        case found(Route, parameters: [String: String])
        case methodNotAllowed(pattern: String, allowed: [HTTPMethod])
        case notFound
    }

    private(set) var routes: [Route] = []

    public init() {}

    /// Adds a route. Registering the same method and pattern shape twice is a programming error and traps.
    public mutating func add(_ method: HTTPMethod, _ pattern: String, body: RequestBody = .any,
                             _ handler: @escaping HTTPHandler) {
        let segments = Self.parse(pattern)
        precondition(!routes.contains { $0.method == method && Self.sameShape($0.segments, segments) },
                     "route \(method) \(pattern) registered twice")
        routes.append(Route(method: method, pattern: pattern, segments: segments, body: body, handler: handler))
    }

    public mutating func get(_ pattern: String, _ handler: @escaping HTTPHandler) {
        add(.get, pattern, handler)
    }

    public mutating func delete(_ pattern: String, body: RequestBody = .any, _ handler: @escaping HTTPHandler) {
        add(.delete, pattern, body: body, handler)
    }

    public mutating func post(_ pattern: String, body: RequestBody = .json, _ handler: @escaping HTTPHandler) {
        add(.post, pattern, body: body, handler)
    }

    public mutating func put(_ pattern: String, body: RequestBody = .json, _ handler: @escaping HTTPHandler) {
        add(.put, pattern, body: body, handler)
    }

    public mutating func patch(_ pattern: String, body: RequestBody = .json, _ handler: @escaping HTTPHandler) {
        add(.patch, pattern, body: body, handler)
    }

    /// `GET path` answering the registry in Prometheus text format, for services to mount next to their API.
    public mutating func addMetrics(at path: String = "/metrics", registry: MetricsRegistry = .shared) {
        get(path) { _ in .text(registry.render(), contentType: "text/plain; version=0.0.4; charset=utf-8") }
    }

    /// `/healthz` (the process is alive) and `/readyz`: 200 `{"status": "ready", "checks": {name: "ok"}}` when
    /// every check of `readiness`'s last round passed, else 503 with status "unavailable" and each check's
    /// answer ("unreachable", or "unknown" before the first round). Answered from memory: no probe runs a check.
    public mutating func addOperations(readiness: ReadinessMonitor) {
        get("/healthz") { _ in try .json(["status": "ok"]) }
        get("/readyz") { _ in
            let results = readiness.results
            let ready = results.values.allSatisfy { $0 == "ok" }
            return try .json(Readiness(status: ready ? "ready" : "unavailable", checks: results), status: ready ? 200 : 503)
        }
    }

    private struct Readiness: Encodable {
        var status: String
        var checks: [String: String]
    }

    /// Finds the route for a raw (percent-encoded) path. Parameters are decoded; a parameter that does not decode
    /// (bad escape, not UTF-8) or is empty does not match.
    func match(method: HTTPMethod, path: String) -> Match {
        guard path.first == "/" else { return .notFound }
        // Walked in place over the path's bytes: no array of its segments per request (every request routes).
        var path = path
        return path.withUTF8 { bytes in match(method: method, bytes: bytes) }
    }

    private func match(method: HTTPMethod, bytes: UnsafeBufferPointer<UInt8>) -> Match {
        let segmentCount = bytes.reduce(0) { $1 == UInt8(ascii: "/") ? $0 + 1 : $0 }
        var allowed: [HTTPMethod] = []
        var allowedPattern = ""
        for route in routes where route.segments.count == segmentCount {
            guard let parameters = Self.bind(route.segments, bytes) else { continue }
            // HEAD is GET without the body (RFC 9110 §9.3.2): the writer leaves the body out.
            if route.method == method || (method == .head && route.method == .get) {
                return .found(route, parameters: parameters)
            }
            if !allowed.contains(route.method) { allowed.append(route.method) }
            if allowedPattern.isEmpty { allowedPattern = route.pattern }
        }
        return allowed.isEmpty ? .notFound : .methodNotAllowed(pattern: allowedPattern, allowed: allowed)
    }

    /// Calls `body` with each segment of `path` (its bytes after the leading `/`, split at every `/`, empty ones
    /// kept) beside the pattern's segment in the same place, while `body` returns true; true if it always did.
    /// The caller has checked that there are as many of one as of the other.
    private static func forEachSegment(_ segments: [Segment], _ path: UnsafeBufferPointer<UInt8>,
                                       _ body: (Segment, UnsafeBufferPointer<UInt8>) -> Bool) -> Bool {
        var start = 1
        for segment in segments {
            var end = start
            while end < path.count, path[end] != UInt8(ascii: "/") { end += 1 }
            guard body(segment, UnsafeBufferPointer(rebasing: path[start..<end])) else { return false }
            start = end + 1
        }
        return true
    }

    private static func bind(_ segments: [Segment], _ path: UnsafeBufferPointer<UInt8>) -> [String: String]? {
        // Literals first: most routes tried fail on one, before any parameter is decoded or stored.
        let literalsMatch = forEachSegment(segments, path) { segment, part in
            guard case .literal(let literal) = segment else { return true }
            return literal.utf8.withContiguousStorageIfAvailable { part.elementsEqual($0) }
                ?? part.elementsEqual(literal.utf8)
        }
        guard literalsMatch else { return nil }
        var parameters: [String: String] = [:]
        let decoded = forEachSegment(segments, path) { segment, part in
            guard case .parameter(let name) = segment else { return true }
            // A slice of a String's UTF-8 at `/` boundaries is valid UTF-8: `decoding` repairs nothing here.
            guard !part.isEmpty, let value = PercentDecoding.decode(Substring(String(decoding: part, as: UTF8.self))),
                  !value.isEmpty else { return false }
            parameters[name] = value
            return true
        }
        return decoded ? parameters : nil
    }

    static func parse(_ pattern: String) -> [Segment] {
        precondition(pattern.first == "/", "route pattern \(pattern) must start with /")
        return pattern.dropFirst().split(separator: "/", omittingEmptySubsequences: false).map { part in
            if part.first == "{", part.last == "}", part.count > 2 {
                return .parameter(String(part.dropFirst().dropLast()))
            }
            precondition(!part.contains("{") && !part.contains("}"), "bad segment \(part) in route \(pattern)")
            return .literal(String(part))
        }
    }

    /// Two patterns that match the same paths (parameter names aside).
    private static func sameShape(_ a: [Segment], _ b: [Segment]) -> Bool {
        guard a.count == b.count else { return false }
        return zip(a, b).allSatisfy { x, y in
            switch (x, y) {
            case (.parameter, .parameter): true
            case let (.literal(l), .literal(r)): l == r
            default: false
            }
        }
    }
}
