import Foundation
import HeraldRedis
import Testing

/// The Redis that `scripts/test` started; integration tests fail (never skip) when it is not configured.
func sharedRedisConfiguration(poolSize: Int = 4, commandTimeout: Duration = .seconds(2)) throws -> RedisConfiguration {
    let url = try #require(ProcessInfo.processInfo.environment["HERALD_TEST_REDIS_URL"],
                           "HERALD_TEST_REDIS_URL is not set: run the tests with scripts/test")
    return try RedisConfiguration(url: url, commandTimeout: commandTimeout, poolSize: poolSize)
}

/// A key prefix no other test (or earlier run) uses.
func freshPrefix(_ test: String = #function) -> String {
    "herald:test:redis:\(test.prefix { $0 != "(" }):\(UUID().uuidString.prefix(8)):"
}

/// A loopback TCP socket that listens but never reads or answers: the kernel completes connections into its
/// backlog, so a client connects fine and then waits forever for replies.
final class SilentServer {
    let fd: Int32
    let port: Int

    init() throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        try #require(fd >= 0, "socket() failed")
        port = try bindLoopback(fd)
        try #require(listen(fd, 64) == 0, "listen() failed")
    }

    deinit { close(fd) }
}

/// A port nothing listens on right now (bound, read back, released).
func closedPort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    try #require(fd >= 0, "socket() failed")
    defer { close(fd) }
    return try bindLoopback(fd)
}

private func bindLoopback(_ fd: Int32) throws -> Int {
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    let bound = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    try #require(bound == 0, "bind() failed")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let named = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    try #require(named == 0, "getsockname() failed")
    return Int(UInt16(bigEndian: address.sin_port))
}

/// Runs a tool found on PATH and returns its exit status and standard output.
///
/// posix_spawn + waitpid on a thread of its own rather than Foundation's Process: under the test runner Process
/// missed the exit of redis-server's daemonizing parent and hung. The child gets an empty signal mask (the test
/// process blocks SIGTERM on its threads, which a daemon would otherwise inherit). Output goes through a file,
/// because a forked daemon would hold a pipe open.
@discardableResult
func runTool(_ arguments: [String]) async throws -> (status: Int32, output: String) {
    let outputPath = FileManager.default.temporaryDirectory.appendingPathComponent("herald-tool-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: outputPath) }

    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, outputPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)

    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var noSignals = sigset_t()
    sigemptyset(&noSignals)
    var allSignals = sigset_t()
    sigfillset(&allSignals)
    posix_spawnattr_setsigmask(&attributes, &noSignals)
    posix_spawnattr_setsigdefault(&attributes, &allSignals)
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

    let argv = arguments.map { strdup($0) } + [nil]
    defer { for argument in argv { free(argument) } }
    var pid: pid_t = 0
    let spawned = posix_spawnp(&pid, arguments[0], &actions, &attributes, argv, environ)
    try #require(spawned == 0, "could not start \(arguments[0]): error \(spawned)")

    let child = pid
    let status: Int32 = await withCheckedContinuation { continuation in
        let waiter = Thread {
            var status: Int32 = 0
            while waitpid(child, &status, 0) == -1, errno == EINTR {}
            continuation.resume(returning: status)
        }
        waiter.start()
    }
    let output = (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? ""
    return ((status >> 8) & 0xff, output)
}

/// Elapsed time of `body` in seconds.
func seconds(_ body: () async throws -> Void) async rethrows -> Double {
    let start = ContinuousClock.now
    try await body()
    let elapsed = ContinuousClock.now - start
    return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
}
