import HeraldRuntime
import Synchronization

/// The server's request logic that does not touch C: running handlers and mapping their errors, request ids,
/// content-type checks, the access log and metrics. The connection code in `Server/` calls into it.
final class RequestEngine: Sendable {
    /// Route label for requests that matched no route (the raw path would make label sets unbounded).
    static let unmatchedRoute = "unmatched"

    let router: Router
    let maxBodyBytes: Int
    let requestDeadline: Duration
    let logger: Logger
    /// An access-log line per request: the configuration says so and the logger writes info lines.
    private let logsRequests: Bool
    private let requests: CounterFamily
    private let durations: HistogramFamily
    private let active = Atomic<Int>(0)
    private let drainingFlag = Atomic<Bool>(false)

    init(router: Router, configuration: HTTPServerConfiguration, logger: Logger, metrics: MetricsRegistry) {
        self.router = router
        maxBodyBytes = configuration.maxBodyBytes
        requestDeadline = configuration.requestDeadline
        self.logger = logger
        logsRequests = configuration.accessLog && logger.minimumLevel <= .info
        requests = metrics.counter("herald_http_requests_total", help: "HTTP requests answered.",
                                   labels: ["route", "method", "status"])
        durations = metrics.histogram("herald_http_request_duration_seconds",
                                      help: "Time from request headers to the end of the response.",
                                      labels: ["route"])
    }

    /// Requests between their first byte of headers and the end of their response.
    var inFlight: Int { active.load(ordering: .relaxed) }

    /// Once set, every response carries `Connection: close` so keep-alive clients move on.
    var draining: Bool {
        get { drainingFlag.load(ordering: .relaxed) }
        set { drainingFlag.store(newValue, ordering: .relaxed) }
    }

    func requestStarted() { active.add(1, ordering: .relaxed) }

    /// Runs a handler and turns whatever it throws into a response.
    func respond(to request: HTTPRequest, with handler: HTTPHandler) async -> HTTPResponse {
        do {
            return try await handler(request)
        } catch let error as HTTPError {
            return error.response
        } catch is CancellationError {
            // Past the request deadline or at shutdown, which answered 503 already: this response goes nowhere.
            return HTTPError.unavailable("the request was cancelled").response
        } catch {
            logger.error("handler failed", ["http.route": request.route, "http.request_id": request.requestID,
                                            "error": "\(error)"])
            return HTTPError.internalError.response
        }
    }

    /// The metric series of one route, method label and status: the loops look each up in the families (a lock
    /// and a dictionary keyed by the label values) once and keep it (`WorkerLoop.series`).
    struct Series {
        let requests: Counter
        let durations: Histogram
    }

    func series(route: String, methodLabel: String, status: Int) -> Series {
        Series(requests: requests.labels(route, methodLabel, String(status)), durations: durations.labels(route))
    }

    /// One access-log line and the metrics of a finished request. `status` is 0 when no response was queued
    /// (the client went away while sending); `series` is the request's metric series, nil when `status` is 0.
    func requestFinished(methodLabel: String, route: String, status: Int, series: Series?,
                         started: ContinuousClock.Instant, requestID: String, bytesIn: Int, bytesOut: Int,
                         completed: Bool) {
        active.subtract(1, ordering: .relaxed)
        let elapsed = ContinuousClock.now - started
        let micros = elapsed.inMicroseconds
        if let series {
            series.requests.increment()
            series.durations.observe(Double(micros) / 1_000_000)
        }
        guard logsRequests else { return }
        var fields: [(key: String, value: String)] = []
        fields.reserveCapacity(8)
        if !completed { fields.append(("http.aborted", "true")) }
        fields += [("http.bytes_in", String(bytesIn)), ("http.bytes_out", String(bytesOut)),
                   ("http.duration_ms", Self.milliseconds(micros)), ("http.method", methodLabel),
                   ("http.request_id", requestID), ("http.route", route), ("http.status", String(status))]
        logger.log(.info, "request", sortedFields: fields)
    }

    /// The client's `X-Request-ID` when it is 1–128 visible ASCII characters, else a fresh random one.
    static func requestID(fromHeader value: String?) -> String {
        if let value, !value.isEmpty, value.utf8.count <= 128,
           value.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) {
            return value
        }
        // A process-random prefix and a mixed counter: unique and unguessable enough for correlation, without a
        // getrandom(2) call per request.
        let sequence = idCounter.wrappingAdd(1, ordering: .relaxed).newValue
        let (prefix, suffix) = (idPrefix, mix(sequence))
        // 32 hex digits written straight into the string's storage: no intermediate strings per request.
        return String(unsafeUninitializedCapacity: 32) { text in
            for index in 0..<16 {
                text[index] = hexDigit(prefix >> UInt64(60 - 4 * index))
                text[16 + index] = hexDigit(suffix >> UInt64(60 - 4 * index))
            }
            return 32
        }
    }

    @inline(__always)
    private static func hexDigit(_ value: UInt64) -> UInt8 {
        let nibble = UInt8(truncatingIfNeeded: value & 0xF)
        return nibble < 10 ? UInt8(ascii: "0") + nibble : UInt8(ascii: "a") + nibble - 10
    }

    private static let idPrefix = UInt64.random(in: .min ... .max)
    private static let idCounter = Atomic<UInt64>(UInt64.random(in: .min ... .max))

    /// SplitMix64's finaliser: a bijection, so distinct counters give distinct ids.
    private static func mix(_ value: UInt64) -> UInt64 {
        var z = value &+ 0x9E37_79B9_7F4A_7C15
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// `application/json`, any case, parameters such as `; charset=utf-8` allowed.
    static func isJSON(contentType: String?) -> Bool {
        guard let contentType else { return false }
        guard contentType.utf8.allSatisfy({ $0 < 0x80 }) else {
            // Unicode rules (a Greek question mark is a ";" to `split`); never on a sane request.
            let mediaType = contentType.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false)[0]
            return mediaType.trimmingSpaces.lowercased() == "application/json"
        }
        // ASCII: bytewise, without allocating.
        var mediaType = contentType.utf8[...]
        if let semicolon = mediaType.firstIndex(of: UInt8(ascii: ";")) { mediaType = mediaType[..<semicolon] }
        while let first = mediaType.first, first == 0x20 || first == 0x09 { mediaType.removeFirst() }
        while let last = mediaType.last, last == 0x20 || last == 0x09 { mediaType.removeLast() }
        return mediaType.elementsEqual("application/json".utf8) { byte, expected in
            (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z") ? byte | 0x20 : byte) == expected
        }
    }

    /// `1.234` from microseconds, without Foundation's formatter on the hot path.
    private static func milliseconds(_ micros: Int64) -> String {
        let fraction = String(micros % 1000)
        return "\(micros / 1000)." + String(repeating: "0", count: 3 - fraction.count) + fraction
    }
}
