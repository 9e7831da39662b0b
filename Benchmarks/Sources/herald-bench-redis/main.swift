import Foundation
import HeraldRedis
import HeraldRuntime
import Synchronization

// Load generator for HeraldRedis, shaped like redis-benchmark so scripts/bench-redis can compare the two:
// `clients` tasks each send one command and await its reply before sending the next, until `requests` are done.

let usage = """
    herald-bench-redis: measures HeraldRedis throughput and latency against a live Redis.

    usage: herald-bench-redis [--url redis://127.0.0.1:16401/0] [--clients 64] [--requests 200000] [--pool 4]
                              [--tests set,incr,evalsha]

    Tests (same commands as redis-benchmark's): set = SET key:__rand_int__ xxx, incr = INCR counter:__rand_int__,
    evalsha = EVALSHA of `\(BenchScript.source)` with key bench:rate.
    Prints one line per test: <TEST> <ops/s> p50=<ms> p99=<ms>
    """

enum BenchScript {
    static let source = "local n = redis.call('INCR', KEYS[1]) redis.call('EXPIRE', KEYS[1], ARGV[1]) return n"
}

struct Options {
    var url = "redis://127.0.0.1:16401/0"
    var clients = 64
    var requests = 200_000
    var pool = 4
    var tests = ["set", "incr", "evalsha"]

    init(_ arguments: [String]) throws {
        var iterator = arguments.dropFirst().makeIterator()
        while let flag = iterator.next() {
            guard let value = iterator.next() else { throw ConfigurationError(flag, "missing value") }
            switch flag {
            case "--url": url = value
            case "--clients": clients = try Self.positive(flag, value)
            case "--requests": requests = try Self.positive(flag, value)
            case "--pool": pool = try Self.positive(flag, value)
            case "--tests": tests = value.split(separator: ",").map { $0.lowercased() }
            default: throw ConfigurationError(flag, "unknown option")
            }
        }
        for test in tests where !["set", "incr", "evalsha"].contains(test) {
            throw ConfigurationError("--tests", "unknown test \"\(test)\"")
        }
    }

    private static func positive(_ flag: String, _ value: String) throws -> Int {
        guard let number = Int(value), number > 0 else { throw ConfigurationError(flag, "expected a positive number") }
        return number
    }
}

/// Hands out request numbers to the client tasks until the total is reached.
final class Tickets: Sendable {
    private let issued = Atomic<Int>(0)
    let total: Int

    init(total: Int) { self.total = total }

    func take() -> Bool { issued.wrappingAdd(1, ordering: .relaxed).oldValue < total }
}

func measure(clients: Int, requests: Int, _ operation: @escaping @Sendable () async throws -> Void) async throws
    -> (opsPerSecond: Double, p50: Double, p99: Double) {
    let tickets = Tickets(total: requests)
    let start = ContinuousClock.now
    let latencies = try await withThrowingTaskGroup(of: [Int64].self) { group in
        for _ in 0..<clients {
            group.addTask {
                var mine: [Int64] = []
                mine.reserveCapacity(requests / clients + 1)
                while tickets.take() {
                    let sent = ContinuousClock.now
                    try await operation()
                    let elapsed = ContinuousClock.now - sent
                    mine.append(elapsed.inNanoseconds)
                }
                return mine
            }
        }
        return try await group.reduce(into: [Int64]()) { $0.append(contentsOf: $1) }.sorted()
    }
    let elapsed = ContinuousClock.now - start
    let seconds = elapsed.inSeconds
    func percentile(_ p: Double) -> Double { Double(latencies[min(latencies.count - 1, Int(Double(latencies.count) * p))]) / 1e6 }
    return (Double(requests) / seconds, percentile(0.5), percentile(0.99))
}

if CommandLineTool.helpRequested() { CommandLineTool.exitWithUsage(usage) }
let options: Options
let configuration: RedisConfiguration
do {
    options = try Options(CommandLine.arguments)
    configuration = try RedisConfiguration(url: options.url, poolSize: options.pool)
} catch {
    CommandLineTool.exitWithConfigurationError("herald-bench-redis", error)
}

let client = RedisClient(configuration: configuration)
let script = RedisScript(source: BenchScript.source)
do {
    // Open every pooled connection (and load the script) before timing anything, as redis-benchmark connects first.
    try await withThrowingTaskGroup(of: Void.self) { group in
        for _ in 0..<(options.pool * 16) { group.addTask { _ = try await client.command(["PING"]) } }
        try await group.waitForAll()
    }
    try await client.run(script, keys: ["bench:rate"], args: ["60"])

    for test in options.tests {
        let operation: @Sendable () async throws -> Void = switch test {
        case "set": { _ = try await client.command(["SET", "key:__rand_int__", "xxx"]) }
        case "incr": { _ = try await client.command(["INCR", "counter:__rand_int__"]) }
        default: { _ = try await client.run(script, keys: ["bench:rate"], args: ["60"]) }
        }
        let result = try await measure(clients: options.clients, requests: options.requests, operation)
        print("\(test.uppercased()) \(Int(result.opsPerSecond)) p50=\(String(format: "%.3f", result.p50))"
              + " p99=\(String(format: "%.3f", result.p99))")
    }
    await client.close()
} catch {
    print("herald-bench-redis: \(error)")
    await client.close()
    exit(1)
}
