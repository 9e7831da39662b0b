import Foundation
import HeraldHTTP
import HeraldRuntime

let usage = """
    herald-bench-http — the HTTP server alone, for scripts/bench-http: POST /v1/bench/events decodes a small JSON
    body in an async handler and answers 201 {"ok":true}.

    Usage: herald-bench-http [--help]

    HERALD_BENCH_HTTP_ADDR     listen address (default 127.0.0.1:8099)
    HERALD_BENCH_HTTP_THREADS  HTTP worker threads (epoll loops) (default 2)
    HERALD_LOG_LEVEL           default warning, so the access log does not dominate the figures
    """

if CommandLineTool.helpRequested() { CommandLineTool.exitWithUsage(usage) }

struct Event: Decodable {
    var id: String
    var channel: String
    var n: Int
}

let environment = EnvironmentReader()
let logger: Logger
let configuration: HTTPServerConfiguration
do {
    let minimumLevel = try environment.logLevel(default: .warning)
    logger = Logger(label: "herald-bench-http", minimumLevel: minimumLevel)
    configuration = HTTPServerConfiguration(
        address: try environment.address("HERALD_BENCH_HTTP_ADDR", default: "127.0.0.1:8099"),
        threads: try environment.int("HERALD_BENCH_HTTP_THREADS", default: 2, range: 1...64))
} catch {
    CommandLineTool.exitWithConfigurationError("herald-bench-http", error)
}

var router = Router()
// The answer is prebuilt, like nginx's `return 201 '{"ok":true}'`; the body is decoded as the ingest API will.
let accepted = Array(#"{"ok":true}"#.utf8)
router.post("/v1/bench/events") { request in
    let event = try request.decodeJSON(Event.self)
    guard !event.id.isEmpty else { throw HTTPError.badRequest("invalid_id", "id must not be empty", field: "id") }
    await Task.yield()  // a suspension point, as the ingest handler's Redis and Kafka awaits will be
    return .json(bytes: accepted, status: 201)
}

do {
    let server = try HTTPServer(configuration: configuration, router: router, logger: logger)
    print("listening on \(server.localAddress)")
    try await ServiceGroup(services: [server], logger: logger).run()
} catch {
    logger.error("herald-bench-http failed", ["error": "\(error)"])
    exit(1)
}
