import Foundation

/// What a handler answers. The server adds `Content-Length`, `Date` and `X-Request-ID` itself.
public struct HTTPResponse: Sendable {
    public var status: Int
    public var headers: HTTPHeaders
    public var body: [UInt8]

    public init(status: Int = 200, headers: HTTPHeaders = HTTPHeaders(), body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// Encodes `value` as the JSON body. Throws the encoder's error (a programming error the server turns
    /// into 500).
    public static func json<Value: Encodable>(_ value: Value, status: Int = 200,
                                              encoder: JSONEncoder = HTTPResponse.jsonEncoder) throws -> HTTPResponse {
        json(bytes: Array(try encoder.encode(value)), status: status)
    }

    /// A body that is already JSON text.
    public static func json(bytes: [UInt8], status: Int = 200) -> HTTPResponse {
        // Room for the few headers a handler adds (the rate-limit ones on every device request) without regrowing.
        var headers = HTTPHeaders(capacity: 4)
        headers.add("Content-Type", "application/json")
        return HTTPResponse(status: status, headers: headers, body: bytes)
    }

    /// A plain-text body (`text/plain; charset=utf-8` unless another type is given).
    public static func text(_ text: String, status: Int = 200,
                            contentType: String = "text/plain; charset=utf-8") -> HTTPResponse {
        var headers = HTTPHeaders()
        headers["Content-Type"] = contentType
        return HTTPResponse(status: status, headers: headers, body: Array(text.utf8))
    }

    /// 204 with no body.
    public static var noContent: HTTPResponse { HTTPResponse(status: 204) }

    /// The encoder `json(_:)` uses by default: sorted keys, so bodies are stable for tests and caches.
    public static let jsonEncoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }()
}
