import Foundation
import HeraldRuntime

/// Identifies a connection pool: one provider key talking to one endpoint (tokens must not be swapped on a
/// connection, so keys never share connections). The key's fingerprint too, as the token cache keys it: two apps
/// whose ids match but whose keys differ (one of them misconfigured) must not alternate tokens on a connection.
struct PoolKey: Hashable, Sendable {
    let teamID: String
    let keyID: String
    let keyFingerprint: String
    let endpoint: APNsEndpoint

    init(_ credentials: APNsCredentials, endpoint: APNsEndpoint) {
        (teamID, keyID, keyFingerprint) = (credentials.teamID, credentials.keyID, credentials.privateKey.fingerprint)
        self.endpoint = endpoint
    }
}

/// Header names and values packed in one buffer. Built on the caller's task so the loop thread only points at it.
struct HeaderBlock: Sendable {
    struct Field: Sendable {
        let nameStart: Int
        let nameLength: Int
        let valueStart: Int
        let valueLength: Int
    }

    let bytes: [UInt8]
    let fields: [Field]

    /// Writes the fields straight into one buffer of at most `capacity` bytes (this runs for every push:
    /// appending to an array piece by piece cost more than the rest of the request's preparation).
    init(capacity: Int, _ build: (inout Writer) -> Void) {
        var fields: [Field] = []
        fields.reserveCapacity(12)
        bytes = [UInt8](unsafeUninitializedCapacity: capacity) { buffer, count in
            var writer = Writer(buffer: buffer, fields: fields)
            build(&writer)
            count = writer.count
            fields = writer.fields
        }
        self.fields = fields
    }

    struct Writer {
        fileprivate let buffer: UnsafeMutableBufferPointer<UInt8>
        fileprivate var fields: [Field]
        fileprivate var count = 0

        fileprivate init(buffer: UnsafeMutableBufferPointer<UInt8>, fields: [Field]) {
            self.buffer = buffer
            self.fields = fields
        }

        mutating func add(_ name: StaticString, _ value: String) {
            let nameStart = start(name)
            write(value)
            finish(nameStart, name)
        }

        /// `prefix` then `value`, without building the joined string; `lowercased` folds ASCII A–Z (hex tokens).
        mutating func add(_ name: StaticString, _ prefix: StaticString, _ value: String, lowercased: Bool = false) {
            let nameStart = start(name)
            write(prefix)
            let valueStart = count
            write(value)
            if lowercased {
                for index in valueStart..<count where buffer[index] >= UInt8(ascii: "A") && buffer[index] <= UInt8(ascii: "Z") {
                    buffer[index] |= 0x20
                }
            }
            finish(nameStart, name)
        }

        /// A UUID in lowercase, as APNs' ids are written.
        mutating func add(_ name: StaticString, _ uuid: UUID) {
            let nameStart = start(name)
            reserve(UUIDText.count)
            UUIDText.write(uuid, to: buffer, at: count)
            count += UUIDText.count
            finish(nameStart, name)
        }

        /// A non-negative integer in decimal.
        mutating func add(_ name: StaticString, _ value: Int) {
            let nameStart = start(name)
            var digits = 1
            var rest = max(0, value)
            while rest >= 10 {
                digits += 1
                rest /= 10
            }
            reserve(digits)
            rest = max(0, value)
            for index in stride(from: count + digits - 1, through: count, by: -1) {
                buffer[index] = UInt8(ascii: "0") + UInt8(rest % 10)
                rest /= 10
            }
            count += digits
            finish(nameStart, name)
        }

        private mutating func start(_ name: StaticString) -> Int {
            let nameStart = count
            write(name)
            return nameStart
        }

        private mutating func finish(_ nameStart: Int, _ name: StaticString) {
            let valueStart = nameStart + name.utf8CodeUnitCount
            fields.append(Field(nameStart: nameStart, nameLength: name.utf8CodeUnitCount, valueStart: valueStart,
                                valueLength: count - valueStart))
        }

        private mutating func write(_ text: StaticString) {
            write(UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
        }

        private mutating func write(_ text: String) {
            let copied: Void? = text.utf8.withContiguousStorageIfAvailable { write($0) }
            if copied == nil { Array(text.utf8).withUnsafeBufferPointer { write($0) } }
        }

        private mutating func write(_ bytes: UnsafeBufferPointer<UInt8>) {
            guard let source = bytes.baseAddress, !bytes.isEmpty else { return }
            reserve(bytes.count)
            (buffer.baseAddress! + count).update(from: source, count: bytes.count)
            count += bytes.count
        }

        private func reserve(_ more: Int) {
            precondition(count + more <= buffer.count, "HeaderBlock capacity \(buffer.count) too small")
        }
    }
}

/// What came back on a stream, before parsing (parsing happens on the caller's task, off the loop).
struct RawResponse: Sendable {
    let status: Int
    let apnsID: String?
    var uniqueID: String? = nil
    /// `apns-channel-id` (channel management and broadcasts).
    var channelID: String? = nil
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
    /// Every slot is overwritten before the caller sees them: the placeholder spares unwrapping (a copy of
    /// every answer) at the end.
    private var results: [Result<RawResponse, any Error>]
    private var remaining: Int
    var continuation: UnsafeContinuation<[Result<RawResponse, any Error>], Never>?

    init(count: Int) {
        results = Array(repeating: .failure(CancellationError()), count: count)
        remaining = count
    }

    func complete(_ index: Int, _ result: Result<RawResponse, any Error>) {
        results[index] = result
        remaining -= 1
        guard remaining == 0, let continuation else { return }
        self.continuation = nil
        let answers = results
        results = []
        continuation.resume(returning: answers)
    }
}

/// One request travelling through the loop: queued in a pool, then on a stream of a connection.
final class PendingRequest: @unchecked Sendable {  // @unchecked: `completion` is set once before the request is posted to the loop; all other mutable state is loop-thread only.
    /// Streams the server said it did not process are sent again, at most this many times in all.
    static let maximumAttempts = 3

    let headers: HeaderBlock
    let body: [UInt8]
    /// When the request fails as `.timeout`.
    let deadline: ContinuousClock.Instant
    let poolKey: PoolKey
    /// How much of a 200 answer's body is kept: none for a push (APNs sends none), the channel list for channel
    /// management.
    let successBodyLimit: Int
    var completion: Completion?

    // Loop-thread state.
    private(set) var isDone = false
    var cancelled = false
    var enqueued = false
    var attempts = 0
    var bodyOffset = 0
    var status = 0
    var apnsID: String?
    var uniqueID: String?
    var channelID: String?
    var responseBody: [UInt8] = []
    var responseComplete = false
    /// Set when a GOAWAY's last-stream-id shows the server never processed this stream.
    var notProcessed = false

    init(headers: HeaderBlock, body: [UInt8], deadline: ContinuousClock.Instant, poolKey: PoolKey,
         successBodyLimit: Int = 0) {
        self.headers = headers
        self.body = body
        self.deadline = deadline
        self.poolKey = poolKey
        self.successBodyLimit = successBodyLimit
    }

    /// True when the server did not process the last attempt and another one is allowed before the deadline.
    func mayRetry(now: ContinuousClock.Instant) -> Bool {
        !isDone && !cancelled && attempts < Self.maximumAttempts && now < deadline
    }

    /// Forgets what the last attempt received, before it is sent again.
    func resetForRetry() {
        bodyOffset = 0
        status = 0
        apnsID = nil
        uniqueID = nil
        channelID = nil
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
