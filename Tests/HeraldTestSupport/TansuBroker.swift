import Foundation
import HeraldRuntime

/// Where `scripts/setup` installs the project's dependencies (Tansu and the Python tools in `venv/`);
/// `HERALD_DEPS` points elsewhere.
public var heraldDependencies: URL {
    if let path = ProcessInfo.processInfo.environment["HERALD_DEPS"], !path.isEmpty { return URL(fileURLWithPath: path) }
    return FileManager.default.homeDirectoryForCurrentUser.appendingPathComponent(".cache/herald")
}

/// A Tansu broker of a test's own on a free port, which the test can crash and start again on the same port.
///
/// Memory storage: a restart starts empty, every topic and producer id lost. A test also gets one when the shared
/// broker of `scripts/test` would skew it: that broker holds every record of the run so far, and Tansu's offset
/// lookups slow down with what it holds.
public final class TansuBroker: Sendable {
    public let port: UInt16
    /// The port clients are told to use (a proxy's in front of the broker); `port` when nil.
    private let advertisedPort: UInt16?
    private let logPath: String
    private let process = Lock<ChildProcess?>(nil)

    public init(logPath: String, advertisedPort: UInt16? = nil) throws {
        port = try freePort()
        self.advertisedPort = advertisedPort
        self.logPath = logPath
    }

    /// A broker started on a free port, logging into `directory`.
    public static func started(directory: String) async throws -> TansuBroker {
        let broker = try TansuBroker(logPath: directory + "/tansu.log")
        try await broker.start()
        return broker
    }

    public var address: String { "127.0.0.1:\(port)" }
    private var tansu: String { heraldDependencies.appendingPathComponent("venv/bin/tansu").path }

    /// Starts a fresh broker on the port and waits until it lists topics.
    public func start() async throws {
        let url = "tcp://\(address)"
        let advertised = "tcp://127.0.0.1:\(advertisedPort ?? port)"
        let child = try ChildProcess("tansu", executable: tansu, arguments: [
            "broker", "--listener-url", url, "--advertised-listener-url", advertised, "--storage-engine", "memory://tansu/",
        ], environment: [:], logPath: logPath)
        process.withLock { $0 = child }
        let tansu = self.tansu
        try await eventually("tansu answers on \(url)", timeout: .seconds(10)) {
            (try? runTool(tansu, ["topic", "list", "--broker", url])) != nil
        }
    }

    /// Stops the broker (SIGSTOP): connections stay open and nothing is answered, until `resume()`.
    public func pause() { process.withLock { $0?.signal(SIGSTOP) } }
    public func resume() { process.withLock { $0?.signal(SIGCONT) } }

    /// A crash (`ChildProcess.crash`): connections drop without goodbye. Also the way to stop it, as a
    /// memory-storage broker has nothing to flush.
    public func crash() async {
        guard let child = process.withLock({ p -> ChildProcess? in defer { p = nil }; return p }) else { return }
        await child.crash()
    }
}
