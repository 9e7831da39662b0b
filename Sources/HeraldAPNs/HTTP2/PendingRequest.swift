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
        add(name) { Self.append(value, to: &$0) }
    }

    /// `prefix` then `value`, without building the joined string.
    mutating func add(_ name: StaticString, _ prefix: StaticString, _ value: String, lowercased: Bool = false) {
        add(name) { bytes in
            bytes.append(contentsOf: UnsafeBufferPointer(start: prefix.utf8Start, count: prefix.utf8CodeUnitCount))
            let start = bytes.count
            Self.append(value, to: &bytes)
            guard lowercased else { return }
            // ASCII only: callers pass hex tokens.
            bytes.withUnsafeMutableBufferPointer { buffer in
                for index in start..<buffer.count where buffer[index] >= UInt8(ascii: "A") && buffer[index] <= UInt8(ascii: "Z") {
                    buffer[index] |= 0x20
                }
            }
        }
    }

    /// One copy of the string's UTF-8 bytes (a native string is contiguous; others go byte by byte).
    private static func append(_ value: String, to bytes: inout [UInt8]) {
        let copied: Void? = value.utf8.withContiguousStorageIfAvailable { bytes.append(contentsOf: $0) }
        if copied == nil { bytes.append(contentsOf: value.utf8) }
    }

    /// A non-negative integer in decimal, without a String.
    mutating func add(_ name: StaticString, _ value: Int) {
        add(name) { bytes in
            let start = bytes.count
            var rest = max(0, value)
            repeat {
                bytes.append(UInt8(ascii: "0") + UInt8(rest % 10))
                rest /= 10
            } while rest > 0
            bytes[start...].reverse()
        }
    }

    private mutating func add(_ name: StaticString, value: (inout [UInt8]) -> Void) {
        let nameStart = bytes.count
        bytes.append(contentsOf: UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
        let valueStart = bytes.count
        value(&bytes)
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

/// Where a request's outcome goes: the one caller of `send(_:)`, or a slot of a `send(_ requests:)` batch.
enum Completion {
    case single(UnsafeContinuation<RawResponse, any Error>)
    case batch(BatchCompletion, index: Int)
}

/// Collects the outcomes of one batch and resumes its caller once, when the last request is resolved: one task
/// resumption per batch instead of one per push.
final class BatchCompletion: @unchecked Sendable {  // @unchecked: `continuation` is set before the batch is posted to the loop; `complete` runs on the loop thread only (or on the caller's thread when the loop never received the batch).
    private var results: [Result<RawResponse, any Error>?]
    private var remaining: Int
    var continuation: UnsafeContinuation<[Result<RawResponse, any Error>], Never>?

    init(count: Int) {
        results = Array(repeating: nil, count: count)
        remaining = count
    }

    func complete(_ index: Int, _ result: Result<RawResponse, any Error>) {
        results[index] = result
        remaining -= 1
        guard remaining == 0, let continuation else { return }
        self.continuation = nil
        continuation.resume(returning: results.map { $0! })
    }
}

/// One request travelling through the loop: queued in a pool, then on a stream of a connection.
final class PendingRequest: @unchecked Sendable {  // @unchecked: `completion` is set once before the request is posted to the loop; all other mutable state is loop-thread only.
    /// Streams the server said it did not process are sent again, at most this many times in all.
    static let maximumAttempts = 3

    let headers: HeaderBlock
    let body: [UInt8]
    /// Monotonic nanoseconds after which the request fails as `.timeout`.
    let deadline: UInt64
    let poolKey: PoolKey
    var completion: Completion?

    // Loop-thread state.
    private(set) var isDone = false
    var cancelled = false
    var enqueued = false
    var attempts = 0
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

    /// True when the server did not process the last attempt and another one is allowed before the deadline.
    func mayRetry(now: UInt64) -> Bool {
        !isDone && !cancelled && attempts < Self.maximumAttempts && now < deadline
    }

    /// Forgets what the last attempt received, before it is sent again.
    func resetForRetry() {
        bodyOffset = 0
        status = 0
        apnsID = nil
        responseBody.removeAll()
        responseComplete = false
        notProcessed = false
    }

    /// Resolves the caller exactly once; later calls are ignored. Loop thread only.
    func resolve(_ result: Result<RawResponse, any Error>) {
        guard !isDone else { return }
        isDone = true
        let completion = completion
        self.completion = nil
        switch completion {
        case .single(let continuation): continuation.resume(with: result)
        case .batch(let batch, let index): batch.complete(index, result)
        case nil: break
        }
    }

    func fail(_ code: APNsError.Code, _ message: String) {
        resolve(.failure(APNsError(code, message)))
    }
}
