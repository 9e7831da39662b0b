/// Serialises responses into the bytes sent on the wire: status line, the handler's headers, the server's own
/// (`X-Request-ID`, `Date`, `Connection`, `Content-Length`) and the body, in one buffer for one `send`.
enum ResponseWriter {
    static func serialize(_ response: HTTPResponse, requestID: String, close: Bool, keepAliveHeader: Bool,
                          headOnly: Bool, dateLine: [UInt8], into output: inout [UInt8]) {
        let status = response.status
        // RFC 9110 §8.6: no Content-Length (and no body) on 1xx, 204 and 304.
        let bodiless = status < 200 || status == 204 || status == 304
        output.reserveCapacity(output.count + 192 + response.headers.count * 48 + (bodiless ? 0 : response.body.count))
        output.append(contentsOf: "HTTP/1.1 ".utf8)
        output.append(contentsOf: String(status).utf8)
        output.append(0x20)
        output.append(contentsOf: reason(status).utf8)
        output.append(contentsOf: crlf)
        for (name, value) in response.headers
        where !HTTPHeaders.sameName(name, "Content-Length") && !HTTPHeaders.sameName(name, "Connection")
            && !HTTPHeaders.sameName(name, "Transfer-Encoding") {
            output.append(contentsOf: name.utf8)
            output.append(contentsOf: ": ".utf8)
            output.append(contentsOf: value.utf8)
            output.append(contentsOf: crlf)
        }
        output.append(contentsOf: "X-Request-ID: ".utf8)
        output.append(contentsOf: requestID.utf8)
        output.append(contentsOf: crlf)
        output.append(contentsOf: dateLine)
        if close {
            output.append(contentsOf: "Connection: close\r\n".utf8)
        } else if keepAliveHeader {
            output.append(contentsOf: "Connection: keep-alive\r\n".utf8)
        }
        if !bodiless {
            output.append(contentsOf: "Content-Length: ".utf8)
            output.append(contentsOf: String(response.body.count).utf8)
            output.append(contentsOf: crlf)
        }
        output.append(contentsOf: crlf)
        if !bodiless, !headOnly { output.append(contentsOf: response.body) }
    }

    private static let crlf: [UInt8] = [13, 10]

    /// RFC 9110's reason phrases for the statuses Herald sends; others get a generic one (clients ignore it).
    static func reason(_ status: Int) -> String {
        switch status {
        case 100: "Continue"
        case 200: "OK"
        case 201: "Created"
        case 202: "Accepted"
        case 204: "No Content"
        case 301: "Moved Permanently"
        case 302: "Found"
        case 304: "Not Modified"
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 403: "Forbidden"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 408: "Request Timeout"
        case 409: "Conflict"
        case 410: "Gone"
        case 413: "Content Too Large"
        case 415: "Unsupported Media Type"
        case 422: "Unprocessable Content"
        case 429: "Too Many Requests"
        case 431: "Request Header Fields Too Large"
        case 500: "Internal Server Error"
        case 501: "Not Implemented"
        case 502: "Bad Gateway"
        case 503: "Service Unavailable"
        case 504: "Gateway Timeout"
        case 505: "HTTP Version Not Supported"
        default:
            switch status / 100 {
            case 1: "Informational"
            case 2: "Success"
            case 3: "Redirection"
            case 4: "Client Error"
            default: "Server Error"
            }
        }
    }
}
