import Foundation
import HeraldAPNs
import HeraldCrypto
import HeraldRuntime
import Testing

/// Runs a command (output discarded) and returns its exit status.
func runCommand(_ arguments: [String]) throws -> Int32 {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = arguments
    process.standardOutput = FileHandle.nullDevice
    process.standardError = FileHandle.nullDevice
    try process.run()
    process.waitUntilExit()
    return process.terminationStatus
}

/// Certificates made with the `openssl` CLI: a test CA, a server certificate for localhost/127.0.0.1 signed by
/// it, one for another host name signed by it, and a self-signed one nobody trusts.
struct TestPKI: Sendable {
    let directory: URL
    var caFile: String { directory.appendingPathComponent("ca.pem").path }
    var serverKey: String { directory.appendingPathComponent("server.key").path }
    var serverCertificate: String { directory.appendingPathComponent("server.pem").path }
    var wrongHostKey: String { directory.appendingPathComponent("wrong.key").path }
    var wrongHostCertificate: String { directory.appendingPathComponent("wrong.pem").path }
    /// Signed by the test CA for Apple's production host and for apns.test.example.
    var appleHostKey: String { directory.appendingPathComponent("apple.key").path }
    var appleHostCertificate: String { directory.appendingPathComponent("apple.pem").path }
    var untrustedKey: String { directory.appendingPathComponent("untrusted.key").path }
    var untrustedCertificate: String { directory.appendingPathComponent("untrusted.pem").path }

    static let shared: TestPKI = {
        do { return try TestPKI() } catch { fatalError("cannot create test certificates: \(error)") }
    }()

    private init() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("herald-apns-pki-\(getpid())")
        self.directory = directory
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let path = { (name: String) in directory.appendingPathComponent(name).path }
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        try Self.check(["openssl", "req", "-x509"] + ec + ["-keyout", path("ca.key"), "-out", path("ca.pem"), "-days", "2",
                                                      "-subj", "/CN=Herald Test CA"])
        for (name, san) in [("server", "DNS:localhost,IP:127.0.0.1"), ("wrong", "DNS:wrong.example"),
                            ("apple", "DNS:api.push.apple.com,DNS:apns.test.example")] {
            try Self.check(["openssl", "req"] + ec + ["-keyout", path("\(name).key"), "-out", path("\(name).csr"),
                                                 "-subj", "/CN=\(name)"])
            try "subjectAltName=\(san)\n".write(toFile: path("\(name).ext"), atomically: true, encoding: .utf8)
            try Self.check(["openssl", "x509", "-req", "-in", path("\(name).csr"), "-CA", path("ca.pem"), "-CAkey",
                       path("ca.key"), "-CAcreateserial", "-out", path("\(name).pem"), "-days", "2", "-extfile",
                       path("\(name).ext")])
        }
        try Self.check(["openssl", "req", "-x509"] + ec + ["-keyout", path("untrusted.key"), "-out", path("untrusted.pem"),
                                                      "-days", "2", "-subj", "/CN=localhost",
                                                      "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
    }

    private static func check(_ arguments: [String]) throws {
        let status = try runCommand(arguments)
        guard status == 0 else { throw TestFailure("\(arguments.joined(separator: " ")) exited with \(status)") }
    }
}

struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A real nghttpd (Debian nghttp2-server) serving HTTP/2 over TLS on 127.0.0.1:`port`.
final class NGHTTPServer: @unchecked Sendable {  // @unchecked: used from one test at a time; Process is thread-safe for these calls.
    let port: UInt16
    let directory: URL
    let logFile: URL
    private var process: Process?
    private let arguments: [String]

    /// `token` gets an (empty) document so `POST /3/device/<token>` answers 200; other paths answer 404.
    init(port: UInt16, options: [String] = [], key: String = TestPKI.shared.serverKey,
         certificate: String = TestPKI.shared.serverCertificate, tokens: [String] = []) throws {
        self.port = port
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("herald-nghttpd-\(port)-\(UUID().uuidString)")
        let documents = directory.appendingPathComponent("docs/3/device")
        try FileManager.default.createDirectory(at: documents, withIntermediateDirectories: true)
        for token in tokens {
            _ = FileManager.default.createFile(atPath: documents.appendingPathComponent(token).path, contents: Data())
        }
        logFile = directory.appendingPathComponent("nghttpd.log")
        arguments = ["nghttpd", "-a", "127.0.0.1", "-d", directory.appendingPathComponent("docs").path] + options
            + [String(port), key, certificate]
        try start()
    }

    deinit {
        kill()
        try? FileManager.default.removeItem(at: directory)
    }

    func start() throws {
        try ensurePortIsFree(port)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = arguments
        if !FileManager.default.fileExists(atPath: logFile.path) {
            _ = FileManager.default.createFile(atPath: logFile.path, contents: nil)
        }
        let handle = try FileHandle(forWritingTo: logFile)
        handle.seekToEndOfFile()
        process.standardOutput = handle
        process.standardError = handle
        try process.run()
        self.process = process
        try waitUntilListening(port: port)
    }

    func kill() {
        guard let process else { return }
        // SIGKILL ends a stopped process too; a SIGCONT first would let it answer what it holds.
        Foundation.kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        self.process = nil
    }

    /// Freezes the server: connections stay open, nothing is answered.
    func pause() { if let process { Foundation.kill(process.processIdentifier, SIGSTOP) } }
    func resume() { if let process { Foundation.kill(process.processIdentifier, SIGCONT) } }

    /// What nghttpd -v printed so far.
    var log: String { (try? String(contentsOf: logFile, encoding: .utf8)) ?? "" }
}

/// True when something accepts TCP connections on 127.0.0.1:`port`.
func isListening(port: UInt16) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    } == 0
}

/// Refuses to start a server on a port something else already holds (a stale server would answer instead).
/// A TCP socket listening on 127.0.0.1:`port` that the test accepts on (or not) itself; the caller closes it.
func loopbackListener(port: UInt16, address host: String = "127.0.0.1", backlog: Int32 = 16) throws -> Int32 {
    if host == "127.0.0.1" { try ensurePortIsFree(port) }
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var one: Int32 = 1
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    address.sin_addr.s_addr = inet_addr(host)
    let bound = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard bound == 0, listen(fd, backlog) == 0 else {
        close(fd)
        throw TestFailure("cannot listen on \(host):\(port)")
    }
    return fd
}

func ensurePortIsFree(_ port: UInt16) throws {
    if isListening(port: port) { throw TestFailure("port \(port) is already in use; stop whatever listens there") }
}

/// Polls until something accepts TCP connections on 127.0.0.1:`port`.
func waitUntilListening(port: UInt16, timeout: Duration = .seconds(5)) throws {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if isListening(port: port) { return }
        usleep(20_000)
    }
    throw TestFailure("nothing listens on port \(port)")
}

/// A wall clock tests move by hand.
final class TestClock: Sendable {
    private let current = Lock(Date(timeIntervalSince1970: 1_800_000_000))
    var now: Date { current.withLock { $0 } }
    func advance(by seconds: TimeInterval) { current.withLock { $0 += seconds } }
}

enum Fixtures {
    static let token = String(repeating: "0123456789abcdef", count: 4)
    static let payload = Array(#"{"aps":{"alert":{"title":"Hi","body":"Hello"}}}"#.utf8)

    static let credentials: APNsCredentials = {
        APNsCredentials(teamID: "TEAM123456", keyID: "KEY1234567", privateKey: try! PrivateKey.generateP256())
    }()

    static func request(token: String = token) -> APNsRequest {
        APNsRequest(deviceToken: token, pushType: .alert, topic: "com.example.app", payload: payload)
    }

    /// A configuration for a local server on `port`, trusting the test CA, with short timers.
    static func configuration(port: UInt16, host: String = "localhost", trustTestCA: Bool = true) -> APNsConfiguration {
        var configuration = APNsConfiguration()
        configuration.productionURL = "https://\(host):\(port)"
        configuration.sandboxURL = "https://\(host):\(port)"
        configuration.extraCAFile = trustTestCA ? TestPKI.shared.caFile : nil
        configuration.connectionsPerEndpoint = 1
        configuration.connectionStagger = .zero
        configuration.requestTimeout = .seconds(5)
        configuration.connectTimeout = .seconds(3)
        configuration.reconnectInitialDelay = .milliseconds(50)
        configuration.reconnectMaximumDelay = .milliseconds(400)
        return configuration
    }

    static let logger = Logger(label: "apns-test", minimumLevel: .error)
}

/// Waits until `condition` holds, polling.
func eventually(timeout: Duration = .seconds(5), _ condition: () async -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if await condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return await condition()
}
