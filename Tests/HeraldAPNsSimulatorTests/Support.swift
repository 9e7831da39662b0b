import Foundation
import HeraldAPNsSimulator
import HeraldCrypto
import HeraldRuntime
import Testing

let teamID = "TEAM123456"
let keyID = "KEY1234567"
let bundleID = "com.example.shop"

/// A device token of `bytes` bytes whose hex starts with `prefix`.
func deviceToken(_ prefix: String = "", bytes: Int = 32) -> String {
    prefix + SecureRandom.hex(bytes).dropFirst(prefix.count)
}

/// A fresh temporary directory.
func temporaryDirectory() throws -> String {
    let path = NSTemporaryDirectory() + "herald-sim-" + SecureRandom.hex(6)
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

/// A simulator on a free loopback port with its own CA, one provider key, and record files in a temporary
/// directory.
final class Harness {
    let directory: String
    let files: SimulatorCertificates.Files
    let key: PrivateKey
    let simulator: APNsSimulator
    let recordPath: String
    let rejectedPath: String
    let rulesPath: String

    let broadcastPath: String

    init(topics: Set<String> = [bundleID], rulesJSON: String? = nil, maxConcurrentStreams: Int = 1000,
         responseDelay: ClosedRange<Duration>? = nil,
         broadcast: (inout APNsSimulatorConfiguration) -> Void = { _ in }) throws {
        directory = try temporaryDirectory()
        files = try SimulatorCertificates.generate(directory: directory + "/tls")
        key = try PrivateKey.generateP256()
        recordPath = directory + "/accepted.jsonl"
        rejectedPath = directory + "/rejected.jsonl"
        rulesPath = directory + "/rules.json"
        broadcastPath = directory + "/broadcasts.jsonl"
        if let rulesJSON { try writeAtomically(rulesJSON, to: rulesPath) }
        var configuration = APNsSimulatorConfiguration(
            listen: HostPort(host: "127.0.0.1", port: 0), certificateChainPath: files.serverCertificate,
            privateKeyPath: files.serverKey,
            providerKeys: [ProviderKey(teamID: teamID, keyID: keyID, publicKey: key.publicKey)],
            allowedTopics: topics, rulesPath: rulesJSON == nil ? nil : rulesPath, recordPath: recordPath,
            rejectedRecordPath: rejectedPath, maxConcurrentStreams: maxConcurrentStreams, responseDelay: responseDelay)
        configuration.manageListen = HostPort(host: "127.0.0.1", port: 0)
        configuration.broadcastRecordPath = broadcastPath
        broadcast(&configuration)
        simulator = try APNsSimulator(configuration: configuration,
                                      logger: Logger(label: "apns-sim-test", minimumLevel: .warning))
        try simulator.start()
    }

    func stop() async {
        simulator.stop()
        await simulator.waitUntilStopped()
    }

    deinit { try? FileManager.default.removeItem(atPath: directory) }

    var base: String { "https://127.0.0.1:\(simulator.port)" }
    /// The channel management listener (a request path starting with `https://` is used as it is).
    var manageBase: String { "https://127.0.0.1:\(simulator.managePort)" }

    /// One provider token for a whole test: another token of the key issued within 20 minutes of it gets 429.
    lazy var providerToken: String = try! jwt()

    /// A provider token signed with the harness key (or `key`), issued `age` seconds ago.
    func jwt(age: Double = 0, kid: String = keyID, iss: String = teamID, key: PrivateKey? = nil) throws -> String {
        let iat = (Date().timeIntervalSince1970 - age).rounded(.down)
        return try JSONWebToken.sign(claims: ["iss": .string(iss), "iat": .number(iat)], keyID: kid,
                                     key: key ?? self.key)
    }

    /// A valid alert push request to `token`.
    func alert(_ token: String, jwt: String? = nil, extra: [(String, String)] = [],
               body: String = #"{"aps":{"alert":{"title":"Hello"}}}"#) throws -> HTTPRequest {
        HTTPRequest(path: "/3/device/" + token,
                    headers: [("authorization", "bearer " + (jwt ?? providerToken)), ("apns-topic", bundleID),
                              ("apns-push-type", "alert")] + extra,
                    body: body)
    }

    func accepted() throws -> [JSONValue] { try jsonLines(recordPath) }
    func broadcasts() throws -> [JSONValue] { try jsonLines(broadcastPath) }
    func rejected() throws -> [JSONValue] { try jsonLines(rejectedPath) }

    func writeRules(_ json: String) throws { try writeAtomically(json, to: rulesPath) }
}

func writeAtomically(_ text: String, to path: String) throws {
    let temporary = path + ".tmp-" + SecureRandom.hex(4)
    try text.write(toFile: temporary, atomically: false, encoding: .utf8)
    guard rename(temporary, path) == 0 else { throw POSIXError(.EIO) }
}

func jsonLines(_ path: String) throws -> [JSONValue] {
    guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return [] }
    return try text.split(separator: "\n").map { try JSONDecoder().decode(JSONValue.self, from: Data($0.utf8)) }
}

struct HTTPRequest {
    var method = "POST"
    var path: String
    var headers: [(String, String)]
    var body: String?

    func with(_ name: String, _ value: String?) -> HTTPRequest {
        var copy = self
        copy.headers.removeAll { $0.0 == name }
        if let value { copy.headers.append((name, value)) }
        return copy
    }
}

/// Sends every case (name, request, status, reason) over one connection, stops the simulator, and checks each
/// answer's status and reason, and that its `idHeader` (`apns-id`, `apns-request-id`), when named, is a lowercase
/// UUID.
func expectAnswers(_ harness: Harness, _ cases: [(String, HTTPRequest, Int, String?)], idHeader: String?) async throws {
    let answers = try await curl(harness, cases.map(\.1))
    await harness.stop()
    try #require(answers.count == cases.count)
    for (index, (name, _, status, reason)) in cases.enumerated() {
        #expect(answers[index].status == status, "\(name): \(answers[index].body)")
        #expect(answers[index].reason == reason, "\(name): \(answers[index].body)")
        if let idHeader { #expect(isLowercaseUUID(answers[index].headers[idHeader]), "\(name)") }
    }
}

struct HTTPResponse {
    var status: Int
    var headers: [String: String]
    var body: String
    /// True when curl opened a new connection for this request.
    var newConnection: Bool
    var seconds: Double

    var json: JSONValue? { try? JSONDecoder().decode(JSONValue.self, from: Data(body.utf8)) }
    var reason: String? { json?["reason"]?.stringValue }
}

struct ProcessResult {
    var status: Int32
    var stdout: String
    var stderr: String
}

/// Runs a program to completion (killed after `timeout`) without blocking the test's thread.
func run(_ executable: String, _ arguments: [String], timeout: Duration = .seconds(20)) async throws -> ProcessResult {
    let directory = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    process.standardInput = FileHandle.nullDevice
    _ = FileManager.default.createFile(atPath: directory + "/out", contents: nil)
    _ = FileManager.default.createFile(atPath: directory + "/err", contents: nil)
    process.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: directory + "/out"))
    process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: directory + "/err"))
    let finished = AsyncStream<Void>.makeStream()
    process.terminationHandler = { _ in finished.continuation.finish() }
    try process.run()
    let watchdog = Task {
        try await Task.sleep(for: timeout)
        process.terminate()
    }
    for await _ in finished.stream {}
    watchdog.cancel()
    return ProcessResult(status: process.terminationStatus,
                         stdout: (try? String(contentsOfFile: directory + "/out", encoding: .utf8)) ?? "",
                         stderr: (try? String(contentsOfFile: directory + "/err", encoding: .utf8)) ?? "")
}

/// Sends `requests` in order with one curl process (so on one connection while the server keeps it open),
/// verifying the server against the harness CA.
func curl(_ harness: Harness, _ requests: [HTTPRequest], extra: [String] = []) async throws -> [HTTPResponse] {
    try await curlResult(harness, requests, extra: extra).responses
}

func curlResult(_ harness: Harness, _ requests: [HTTPRequest], extra: [String] = [],
                cacert: Bool = true) async throws -> (responses: [HTTPResponse], result: ProcessResult) {
    let directory = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(atPath: directory) }
    var arguments: [String] = []
    for (index, request) in requests.enumerated() {
        if index > 0 { arguments.append("--next") }
        arguments += ["-sS", "--http2", "--max-time", "10", "-X", request.method]
        if cacert { arguments += ["--cacert", harness.files.caCertificate] }
        arguments += extra
        for (name, value) in request.headers { arguments += ["-H", "\(name): \(value)"] }
        if let body = request.body {
            let file = directory + "/body-\(index)"
            try body.write(toFile: file, atomically: false, encoding: .utf8)
            arguments += ["--data-binary", "@" + file]
        }
        arguments += ["-D", directory + "/headers-\(index)", "-o", directory + "/response-\(index)",
                      "-w", "%{http_code} %{num_connects} %{time_total}\n",
                      request.path.hasPrefix("https://") ? request.path : harness.base + request.path]
    }
    let result = try await run("/usr/bin/curl", arguments)
    var responses: [HTTPResponse] = []
    for (index, line) in result.stdout.split(separator: "\n").enumerated() {
        let parts = line.split(separator: " ")
        guard parts.count == 3, let status = Int(parts[0]), status > 0 else { continue }
        var headers: [String: String] = [:]
        let headerText = (try? String(contentsOfFile: directory + "/headers-\(index)", encoding: .utf8)) ?? ""
        for headerLine in headerText.split(separator: "\r\n") {
            guard let colon = headerLine.firstIndex(of: ":") else { continue }
            headers[headerLine[..<colon].lowercased()] = headerLine[headerLine.index(after: colon)...]
                .trimmingCharacters(in: .whitespaces)
        }
        responses.append(HTTPResponse(
            status: status, headers: headers,
            body: (try? String(contentsOfFile: directory + "/response-\(index)", encoding: .utf8)) ?? "",
            newConnection: parts[1] != "0", seconds: Double(parts[2]) ?? 0))
    }
    return (responses, result)
}

/// Runs `nghttp -v` against the harness with the same headers on every URI (one connection, concurrent
/// streams) and returns its verbose frame log.
func nghttp(_ harness: Harness, paths: [String], headers: [(String, String)], body: String?) async throws -> String {
    let directory = try temporaryDirectory()
    defer { try? FileManager.default.removeItem(atPath: directory) }
    var arguments = ["-v", "-n", "--timeout=10"]
    for (name, value) in headers { arguments += ["-H", "\(name): \(value)"] }
    if let body {
        try body.write(toFile: directory + "/body", atomically: false, encoding: .utf8)
        arguments += ["-d", directory + "/body"]
    }
    arguments += paths.map { harness.base + $0 }
    return try await run("/usr/bin/nghttp", arguments).stdout
}

func isLowercaseUUID(_ text: String?) -> Bool {
    guard let text, UUID(uuidString: text) != nil else { return false }
    return text == text.lowercased() && text.count == 36
}
