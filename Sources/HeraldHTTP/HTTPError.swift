import HeraldRuntime

/// An error a handler throws to answer with a status and the JSON error body
/// `{"error": {"code": "...", "message": "...", "field": "..."}}` (`field` only when set).
///
/// This is the one place HTTP errors become responses. Any other error a handler throws becomes
/// 500 `internal_error` with a generic message; its details go to the log only.
public struct HTTPError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The HTTP status code (4xx or 5xx).
    public var status: Int
    /// A stable snake_case code clients can branch on, e.g. `invalid_json`.
    public var code: String
    /// A human-readable explanation. Never include internals, tokens or keys.
    public var message: String
    /// The request field at fault, when exactly one is.
    public var field: String?
    /// Extra response headers, e.g. `Allow` for 405 or `Retry-After` for 429.
    public var headers: [String: String]

    public init(status: Int, code: String, message: String, field: String? = nil, headers: [String: String] = [:]) {
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers
    }

    public var description: String {
        "\(status) \(code): \(message)" + (field.map { " (field \($0))" } ?? "")
    }

    /// The response carrying this error's JSON body and headers.
    public var response: HTTPResponse {
        var body = "{\"error\":{\"code\":"
        JSONText.appendQuoted(code, to: &body)
        body += ",\"message\":"
        JSONText.appendQuoted(message, to: &body)
        if let field {
            body += ",\"field\":"
            JSONText.appendQuoted(field, to: &body)
        }
        body += "}}"
        var response = HTTPResponse.json(bytes: Array(body.utf8), status: status)
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) { response.headers[name] = value }
        return response
    }

    // MARK: Built-in errors

    /// 400 with a caller-chosen code, e.g. `badRequest("invalid_channel", "…", field: "channel")`.
    public static func badRequest(_ code: String, _ message: String, field: String? = nil) -> HTTPError {
        HTTPError(status: 400, code: code, message: message, field: field)
    }

    /// 400 `invalid_json`: the body is not JSON or does not have the expected shape.
    public static func invalidJSON(_ message: String, field: String? = nil) -> HTTPError {
        HTTPError(status: 400, code: "invalid_json", message: message, field: field)
    }

    /// 404 `not_found`: no route for this path (services also use it for an unknown app).
    public static func notFound(_ message: String = "no such resource") -> HTTPError {
        HTTPError(status: 404, code: "not_found", message: message)
    }

    /// 405 `method_not_allowed` with the `Allow` header listing the methods the path takes.
    public static func methodNotAllowed(allowed: [HTTPMethod]) -> HTTPError {
        let allow = allowed.map(\.rawValue).joined(separator: ", ")
        return HTTPError(status: 405, code: "method_not_allowed", message: "this path takes \(allow)",
                         headers: ["Allow": allow])
    }

    /// 413 `body_too_large`.
    public static func bodyTooLarge(limit: Int) -> HTTPError {
        HTTPError(status: 413, code: "body_too_large", message: "the request body is larger than \(limit) bytes")
    }

    /// 415 `unsupported_media_type`: a JSON route got another Content-Type.
    public static let unsupportedMediaType = HTTPError(
        status: 415, code: "unsupported_media_type", message: "the request body must be application/json")

    /// 500 `internal_error`, deliberately vague.
    public static let internalError = HTTPError(
        status: 500, code: "internal_error", message: "the server failed to handle the request")

    /// 503 `unavailable`: a dependency cannot be reached in time, or the server is shutting down.
    public static func unavailable(_ message: String) -> HTTPError {
        HTTPError(status: 503, code: "unavailable", message: message)
    }
}
