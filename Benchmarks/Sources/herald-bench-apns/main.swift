// Pushes per second through HeraldAPNs against an HTTP/2 server (scripts/bench-apns runs it next to h2load).
import Foundation
import HeraldAPNs
import HeraldCrypto
import HeraldRuntime
import Synchronization

let usage = """
    usage: herald-bench-apns --url https://host:port --ca-file FILE --key FILE [--count N] [--connections N]
                             [--concurrency N] [--batch N] [--payload FILE] [--token HEX] [--topic TOPIC]
           herald-bench-apns --print-jwt --key FILE
    Sends --count pushes (after a 10,000-push warm-up) over --connections HTTP/2 connections from --concurrency
    tasks, each looping on `send(_:)` (or, with --batch N, on `send(_ requests:)` with N requests), then prints
    the rate, the CPU time per push and the process RSS after the warm-up and after the run.
    """

struct Options {
    var url = ""
    var caFile: String?
    var keyFile = ""
    var count = 200_000
    var connections = 2
    var concurrency = 200
    var payloadFile: String?
    var batch = 0
    var token = String(repeating: "ab12", count: 16)
    var topic = "com.example.bench"
    var printJWT = false
}

func parseOptions() -> Options {
    var options = Options()
    var arguments = CommandLine.arguments.dropFirst().makeIterator()
    func value(_ flag: String) -> String {
        guard let value = arguments.next() else { CommandLineTool.exitWithUsage(usage) }
        return value
    }
    while let flag = arguments.next() {
        switch flag {
        case "--url": options.url = value(flag)
        case "--ca-file": options.caFile = value(flag)
        case "--key": options.keyFile = value(flag)
        case "--count": options.count = Int(value(flag)) ?? 0
        case "--connections": options.connections = Int(value(flag)) ?? 0
        case "--concurrency": options.concurrency = Int(value(flag)) ?? 0
        case "--payload": options.payloadFile = value(flag)
        case "--batch": options.batch = Int(value(flag)) ?? -1
        case "--token": options.token = value(flag)
        case "--topic": options.topic = value(flag)
        case "--print-jwt": options.printJWT = true
        default: CommandLineTool.exitWithUsage(usage)
        }
    }
    guard !options.keyFile.isEmpty, options.printJWT || !options.url.isEmpty, options.count > 0,
          options.connections > 0, options.concurrency > 0,
          options.batch >= 0 else { CommandLineTool.exitWithUsage(usage) }
    return options
}

/// Resident set size in MiB, from /proc/self/status.
func residentMiB() -> Double {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
          let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
          let kilobytes = Double(line.split(separator: " ")[1]) else { return -1 }
    return kilobytes / 1024
}

/// User + system CPU seconds of this process so far.
func cpuSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
        + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

/// Runs `total` sends from `concurrency` tasks, one request per call, or `batch` per call when it is above 0;
/// returns (seconds, failures).
func run(client: APNsClient, request: APNsRequest, credentials: APNsCredentials, total: Int, concurrency: Int,
         batch: Int) async -> (Double, Int) {
    final class Progress: Sendable {
        let next = Atomic<Int>(0)
        let failures = Atomic<Int>(0)
    }
    let progress = Progress()
    let started = ContinuousClock.now
    await withTaskGroup(of: Void.self) { group in
        for _ in 0..<concurrency {
            group.addTask {
                if batch > 0 {
                    while case let first = progress.next.add(batch, ordering: .relaxed).oldValue, first < total {
                        let requests = Array(repeating: request, count: min(batch, total - first))
                        do {
                            let results = try await client.send(requests, credentials: credentials, environment: .production)
                            let failed = results.count { (try? $0.get().status) != 200 }
                            progress.failures.add(failed, ordering: .relaxed)
                        } catch {
                            progress.failures.add(requests.count, ordering: .relaxed)
                        }
                    }
                    return
                }
                while progress.next.add(1, ordering: .relaxed).oldValue < total {
                    do {
                        let response = try await client.send(request, credentials: credentials, environment: .production)
                        if response.status != 200 { progress.failures.add(1, ordering: .relaxed) }
                    } catch {
                        progress.failures.add(1, ordering: .relaxed)
                    }
                }
            }
        }
    }
    return (seconds(since: started), progress.failures.load(ordering: .relaxed))
}

func seconds(since start: ContinuousClock.Instant) -> Double {
    let elapsed = ContinuousClock.now - start
    return elapsed.inSeconds
}

let options = parseOptions()
do {
    let key = try PrivateKey(pem: String(contentsOfFile: options.keyFile, encoding: .utf8))
    let credentials = APNsCredentials(teamID: "TEAM123456", keyID: "KEY1234567", privateKey: key)
    if options.printJWT {
        print(try APNsProviderTokenCache(metrics: MetricsRegistry()).token(for: credentials).value)
        exit(0)
    }
    var configuration = APNsConfiguration()
    configuration.productionURL = options.url
    configuration.sandboxURL = options.url
    configuration.extraCAFile = options.caFile
    configuration.connectionsPerEndpoint = options.connections
    configuration.connectionStagger = .milliseconds(10)
    let payload = try options.payloadFile.map { Array(try Data(contentsOf: URL(fileURLWithPath: $0))) }
        ?? Array(#"{"aps":{"alert":{"title":"Benchmark","body":"Hello from Herald"},"sound":"default"}}"#.utf8)
    let request = APNsRequest(deviceToken: options.token, pushType: .alert, topic: options.topic, payload: payload)
    let client = try APNsClient(configuration: configuration, logger: Logger(label: "bench", minimumLevel: .warning),
                                metrics: MetricsRegistry())
    let (warmSeconds, warmFailures) = await run(client: client, request: request, credentials: credentials,
                                                total: 10_000, concurrency: options.concurrency, batch: options.batch)
    let rssWarm = residentMiB()
    let cpuBefore = cpuSeconds()
    let (seconds, failures) = await run(client: client, request: request, credentials: credentials,
                                        total: options.count, concurrency: options.concurrency, batch: options.batch)
    let cpuPerPush = (cpuSeconds() - cpuBefore) * 1e6 / Double(options.count)
    let rssEnd = residentMiB()
    // Shows both tools had the same streams on the wire: h2load's -m, the client's peak per connection.
    let peakStreams = await client.connections().map { String($0.peakActiveStreams) }.joined(separator: ",")
    await client.shutdown()
    print(String(format: "herald-bench-apns: warmup=10000 in %.2fs; pushes=%d seconds=%.3f rate=%.0f/s failures=%d "
                 + "cpu_us_per_push=%.1f peak_streams_per_connection=%@ rss_after_10k_mib=%.1f rss_after_%d_mib=%.1f",
                 warmSeconds, options.count, seconds, Double(options.count) / seconds, failures + warmFailures,
                 cpuPerPush, peakStreams,
                 rssWarm, 10_000 + options.count, rssEnd))
} catch {
    CommandLineTool.exitWithConfigurationError("herald-bench-apns", error)
}
