import Foundation

/// Identifies a connection pool: one provider key talking to one endpoint (tokens must not be swapped on a
/// connection, so keys never share connections).
struct PoolKey: Hashable, Sendable {
    let teamID: String
    let keyID: String
    let endpoint: APNsEndpoint
}

/// Header names and values packed in one buffer. Built on the caller's task so the loop thread only points at it.
struct HeaderBlock: Sendable {
    struct Field: Sendable {
        let nameStart: Int
        let nameLength: Int
        let valueStart: Int
        let valueLength: Int
    }

    private(set) var bytes: [UInt8] = []
    private(set) var fields: [Field] = []

    init(capacity: Int) {
        bytes.reserveCapacity(capacity)
        fields.reserveCapacity(12)
    }

    mutating func add(_ name: StaticString, _ value: String) {
        let nameStart = bytes.count
        bytes.append(contentsOf: UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
        let valueStart = bytes.count
        bytes.append(contentsOf: value.utf8)
        fields.append(Field(nameStart: nameStart, nameLength: valueStart - nameStart, valueStart: valueStart,
                            valueLength: bytes.count - valueStart))
    }
}

/// What came back on a stream, before parsing (parsing happens on the caller's task, off the loop).
struct RawResponse: Sendable {
    let status: Int
    let apnsID: String?
    let body: [UInt8]
}

/// One request travelling through the loop: queued in a pool, then on a stream of a connection.
final class PendingRequest: @unchecked Sendable {  // @unchecked: `continuation` is set once before the request is posted to the loop; all other mutable state is loop-thread only.
    let headers: HeaderBlock
    let body: [UInt8]
    /// Monotonic nanoseconds after which the request fails as `.timeout`.
    let deadline: UInt64
    let poolKey: PoolKey
    var continuation: CheckedContinuation<RawResponse, any Error>?

    // Loop-thread state.
    private(set) var isDone = false
    var cancelled = false
    var enqueued = false
    var bodyOffset = 0
    var status = 0
    var apnsID: String?
    var responseBody: [UInt8] = []
    var responseComplete = false
    /// Set when a GOAWAY's last-stream-id shows the server never processed this stream.
    var notProcessed = false

    init(headers: HeaderBlock, body: [UInt8], deadline: UInt64, poolKey: PoolKey) {
        self.headers = headers
        self.body = body
        self.deadline = deadline
        self.poolKey = poolKey
    }

    /// Resolves the caller exactly once; later calls are ignored. Loop thread only.
    func resolve(_ result: Result<RawResponse, any Error>) {
        guard !isDone else { return }
        isDone = true
        let continuation = continuation
        self.continuation = nil
        continuation?.resume(with: result)
    }

    func fail(_ code: APNsError.Code, _ message: String) {
        resolve(.failure(APNsError(code, message)))
    }
}
