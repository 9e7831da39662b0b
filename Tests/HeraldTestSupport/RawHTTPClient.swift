import Foundation

/// A deliberately small blocking HTTP/1.1 client on a POSIX socket, so tests control every byte (chunked bodies,
/// early disconnects, keep-alive) and see exactly what the server wrote.
public final class RawHTTPClient {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public struct Response: Sendable {
        public var status: Int
        /// Lower-cased names.
        public var headers: [String: String]
        public var body: [UInt8]
        public var text: String { String(decoding: body, as: UTF8.self) }
        public func json() throws -> [String: Any] {
            guard let object = try JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else {
                throw Failure(description: "not a JSON object: \(text)")
            }
            return object
        }
    }

    private let fd: Int32
    private var buffer: [UInt8] = []

    /// Connects to 127.0.0.1:`port`; every read and write times out after `timeout` seconds. `receiveBuffer`
    /// shrinks the socket's receive buffer (a slow reader, for the server's partial writes).
    public init(port: UInt16, timeout: Int = 5, receiveBuffer: Int32? = nil) throws {
        // `self.fd` is set only once connected: a throwing init of a fully set object still runs deinit, which
        // would close the descriptor a second time (by then perhaps another thread's socket).
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw Failure(description: "socket: \(String(cString: strerror(errno)))") }
        var time = timeval(tv_sec: timeout, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &time, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &time, socklen_t(MemoryLayout<timeval>.size))
        if var size = receiveBuffer {
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else {
            let code = errno
            Foundation.close(fd)
            throw Failure(description: "connect: \(String(cString: strerror(code)))")
        }
        self.fd = fd
    }

    deinit { Foundation.close(fd) }

    public func send(_ text: String) throws { try send(Array(text.utf8)) }

    public func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { Foundation.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard written > 0 else { throw Failure(description: "send: \(String(cString: strerror(errno)))") }
            offset += written
        }
    }

    /// Shuts down the sending side (a FIN): the client has nothing more to send and still reads.
    public func shutdownWrite() { _ = Foundation.shutdown(fd, Int32(SHUT_WR)) }

    /// Sends a request with `Content-Length` (when there is a body) and reads the response.
    public func request(_ method: String, _ path: String, headers: [String: String] = [:], body: String? = nil) throws -> Response {
        var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if let body { head += "Content-Length: \(body.utf8.count)\r\n" }
        try send(head + "\r\n" + (body ?? ""))
        return try readResponse()
    }

    /// Reads one response framed by Content-Length (all this server sends), or up to EOF without one.
    public func readResponse() throws -> Response {
        let headerEnd = try readUntil(Array("\r\n\r\n".utf8))
        let head = String(decoding: buffer[..<headerEnd], as: UTF8.self)
        buffer.removeFirst(headerEnd + 4)
        var lines = head.components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst().split(separator: " ")
        guard statusLine.count >= 2, let status = Int(statusLine[1]) else {
            throw Failure(description: "bad status line in \(head)")
        }
        var headers: [String: String] = [:]
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        if let length = headers["content-length"].flatMap(Int.init) {
            while buffer.count < length { guard try fill() else { throw Failure(description: "EOF in body") } }
            let body = Array(buffer[..<length])
            buffer.removeFirst(length)
            return Response(status: status, headers: headers, body: body)
        }
        while try fill() {}
        defer { buffer = [] }
        return Response(status: status, headers: headers, body: buffer)
    }

    /// Raw bytes, for what the response framing does not cover (interim responses, slow reading): everything up
    /// to and including the first `marker`, as text; what follows stays buffered.
    public func read(until marker: String) throws -> String {
        let pattern = Array(marker.utf8)
        let start = try readUntil(pattern)
        let end = start + pattern.count
        defer { buffer.removeFirst(end) }
        return String(decoding: buffer[..<end], as: UTF8.self)
    }

    /// Up to `max` raw bytes: what is buffered first, else one read from the socket; empty at end of stream.
    public func receive(max: Int) throws -> [UInt8] {
        if buffer.isEmpty, try !fill() { return [] }
        let count = min(max, buffer.count)
        defer { buffer.removeFirst(count) }
        return Array(buffer[..<count])
    }

    /// True when the server has closed the connection (EOF before any byte).
    public func isClosedByServer() -> Bool {
        (try? fill()) == false
    }

    private func readUntil(_ marker: [UInt8]) throws -> Int {
        while true {
            if buffer.count >= marker.count {
                for start in 0...(buffer.count - marker.count) where buffer[start..<start + marker.count].elementsEqual(marker) {
                    return start
                }
            }
            guard try fill() else {
                throw Failure(description: "connection closed before \(String(decoding: marker, as: UTF8.self))")
            }
        }
    }

    /// Reads what is available; false on EOF.
    private func fill() throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 16_384)
        let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if count < 0 {
            if errno == ECONNRESET { return false }
            throw Failure(description: "recv: \(String(cString: strerror(errno)))")
        }
        buffer.append(contentsOf: chunk[..<count])
        return count > 0
    }
}

/// Runs blocking socket code on a thread of its own, keeping Swift's small cooperative pool (2 threads on this
/// box) free for the server's handlers.
public func onThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let thread = Thread {
            do { continuation.resume(returning: try body()) } catch { continuation.resume(throwing: error) }
        }
        thread.start()
    }
}
