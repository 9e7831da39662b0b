import Foundation
import HeraldRuntime

/// A complete request as a handler sees it: the body has been read in full (within the size limit).
public struct HTTPRequest: Sendable {
    public var method: HTTPMethod
    /// The path as sent, still percent-encoded, without the query. It may contain secrets (tokens in path
    /// parameters): log `route` instead.
    public var path: String
    /// The pattern of the route that matched, e.g. `/v1/apps/{appID}/subscriptions`.
    public var route: String
    /// Decoded values of the pattern's `{name}` segments.
    public var pathParameters: [String: String]
    /// Decoded query arguments (`+` is a space); for a repeated name the last value wins; a name without `=` maps
    /// to "".
    public var query: [String: String]
    public var headers: HTTPHeaders
    public var body: [UInt8]
    /// The client's `X-Request-ID` when sane (1–128 visible ASCII characters), else a generated one.
    public var requestID: String
    /// The peer's IP address, when known.
    public var remoteAddress: String?

    public init(method: HTTPMethod, path: String, route: String, pathParameters: [String: String] = [:],
                query: [String: String] = [:], headers: HTTPHeaders = HTTPHeaders(), body: [UInt8] = [],
                requestID: String, remoteAddress: String? = nil) {
        self.method = method
        self.path = path
        self.route = route
        self.pathParameters = pathParameters
        self.query = query
        self.headers = headers
        self.body = body
        self.requestID = requestID
        self.remoteAddress = remoteAddress
    }

    /// The decoded `{name}` path segment. Routes guarantee their parameters, so a missing name is a typo in the
    /// handler; it answers 500 rather than crashing.
    public func pathParameter(_ name: String) throws(HTTPError) -> String {
        guard let value = pathParameters[name] else { throw HTTPError.internalError }
        return value
    }

    /// The body as a JSON value, or 400 `invalid_json` when it is empty or not JSON: `JSONValue`'s strict parser,
    /// much cheaper than `JSONDecoder` on the hot endpoints.
    public func jsonBody() throws(HTTPError) -> JSONValue {
        guard !body.isEmpty else { throw HTTPError.invalidJSON("the request body is empty") }
        guard let value = JSONValue(parsing: body) else {
            throw HTTPError.invalidJSON("the request body is not valid JSON (\(JSONValue.inexactIntegerHint))")
        }
        return value
    }

    /// The `query` of a request from its arguments as sent (split at `&` and the first `=`, still
    /// percent-encoded): names and values decoded, a name that does not decode dropped, a value that does not
    /// decode kept as sent, the last of a repeated name kept.
    public static func query(arguments: some Sequence<(name: String, value: String)>) -> [String: String] {
        var query: [String: String] = [:]
        for (name, value) in arguments {
            if let name = PercentDecoding.decode(Substring(name)) {
                query[name] = PercentDecoding.decode(Substring(value)) ?? value
            }
        }
        return query
    }

    /// Decodes the JSON body, or throws 400 `invalid_json` naming the field at fault when there is one.
    public func decodeJSON<Value: Decodable>(_ type: Value.Type = Value.self,
                                             decoder: JSONDecoder = HTTPRequest.jsonDecoder) throws(HTTPError) -> Value {
        guard !body.isEmpty else { throw HTTPError.invalidJSON("the request body is empty") }
        do {
            return try decoder.decode(Value.self, from: Data(body))
        } catch let error as DecodingError {
            throw Self.describe(error)
        } catch {
            throw HTTPError.invalidJSON("the request body is not valid JSON")
        }
    }

    /// The decoder `decodeJSON` uses by default.
    public static let jsonDecoder = JSONDecoder()

    static func describe(_ error: DecodingError) -> HTTPError {
        switch error {
        case .keyNotFound(let key, let context):
            let field = fieldPath(context.codingPath + [key])
            return .invalidJSON("missing field \"\(field)\"", field: field)
        case .valueNotFound(_, let context):
            let field = fieldPath(context.codingPath)
            return .invalidJSON("field \"\(field)\" must not be null", field: field)
        case .typeMismatch(let type, let context):
            let field = fieldPath(context.codingPath)
            if field.isEmpty { return .invalidJSON("the request body must be \(kind(of: type))") }
            return .invalidJSON("field \"\(field)\" must be \(kind(of: type))", field: field)
        case .dataCorrupted(let context):
            let field = fieldPath(context.codingPath)
            if field.isEmpty { return .invalidJSON("the request body is not valid JSON") }
            return .invalidJSON("field \"\(field)\" is invalid: \(context.debugDescription)", field: field)
        @unknown default:
            return .invalidJSON("the request body is not valid JSON")
        }
    }

    /// `alert.aps.badge`, `items[2].id`.
    private static func fieldPath(_ path: [any CodingKey]) -> String {
        var out = ""
        for key in path {
            if let index = key.intValue, key.stringValue == "Index \(index)" || key.stringValue == "\(index)" {
                out += "[\(index)]"
            } else {
                if !out.isEmpty { out += "." }
                out += key.stringValue
            }
        }
        return out
    }

    private static func kind(of type: Any.Type) -> String {
        switch type {
        case is String.Type: "a string"
        case is Bool.Type: "a boolean"
        case is Int.Type, is Int64.Type, is Int32.Type, is UInt.Type, is UInt64.Type, is UInt32.Type: "an integer"
        case is Double.Type, is Float.Type: "a number"
        case is [Any].Type: "an array"
        case is [String: Any].Type: "an object"
        default: "a JSON \(type)"
        }
    }
}
