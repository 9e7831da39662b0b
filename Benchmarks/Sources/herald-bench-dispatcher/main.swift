import Foundation
import HeraldCore
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldStore

// The load side of scripts/bench-dispatcher: seeds subscriptions through the real data model and produces jobs.
let usage = """
    herald-bench-dispatcher — seeds channels and produces jobs for scripts/bench-dispatcher.

      seed    --redis URL --app ID --channel NAME --count N          N alert subscribers on one channel
              [--tokens-out FILE]                                     (their device tokens, one a line)
      seed    --redis URL --app ID --channel PREFIX --channels N     one subscriber on each of N channels PREFIX-<i>
      fanout  --brokers LIST --topic T --app ID --channel NAME       one alert job for the channel
      rate    --brokers LIST --topic T --app ID --channel PREFIX --channels N --rate R --seconds S [--warm-up W]
              R jobs/s for W + S s, round-robin over PREFIX-<i>; each payload carries "sentAt" (ms) and "jobId", and the
              first W s of jobs "warmUp": true (the producer's and the dispatcher's cold start, reported apart)
    """

if CommandLineTool.helpRequested() || CommandLine.arguments.count < 2 { CommandLineTool.exitWithUsage(usage) }
let command = CommandLine.arguments[1]
/// `--name value` pairs after the command.
let options: [String: String] = stride(from: 2, to: CommandLine.arguments.count - 1, by: 2).reduce(into: [:]) { found, i in
    found[String(CommandLine.arguments[i].drop { $0 == "-" })] = CommandLine.arguments[i + 1]
}
func option(_ name: String) -> String {
    guard let value = options[name] else { CommandLineTool.exitWithConfigurationError("herald-bench-dispatcher", ConfigurationError("--" + name, "is required")) }
    return value
}
let logger = Logger(label: "bench", minimumLevel: .warning)

func hexToken() -> String { (0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined() }

switch command {
case "seed":
    let redis = RedisClient(configuration: try RedisConfiguration(url: option("redis"), poolSize: 4))
    let store = SubscriptionStore(redis: redis)
    let app = option("app")
    let channels = Int(options["channels"] ?? "0") ?? 0
    let count = channels > 0 ? channels : Int(option("count")) ?? 0
    let tokens = (0..<count).map { _ in hexToken() }
    if let file = options["tokens-out"] {
        try tokens.joined(separator: "\n").appending("\n").write(toFile: file, atomically: true, encoding: .utf8)
    }
    let started = ContinuousClock.now
    for start in stride(from: 0, to: count, by: 256) {
        try await withThrowingTaskGroup(of: Void.self) { group in
            for i in start..<min(count, start + 256) {
                let channel = channels > 0 ? "\(option("channel"))-\(i)" : option("channel")
                group.addTask {
                    _ = try await store.upsert(app: app, SubscriptionInput(.object([
                        "channel": .string(channel), "deviceToken": .string(tokens[i]), "tokenType": .string("alert"),
                    ])))
                }
            }
            try await group.waitForAll()
        }
    }
    print("seeded \(count) subscriptions in \(ContinuousClock.now - started)")
    await redis.close()

case "fanout", "rate":
    let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(
        kafka: KafkaConfiguration(brokerList: option("brokers"))), logger: logger)
    let topic = option("topic"), app = option("app")
    // Signed as ingest signs (HERALD_JOB_SIGNING_SECRET_FILE, as the dispatcher under test reads it).
    let signing = try JobSigning(EnvironmentReader())
    func send(_ job: PushJob) async throws {
        let value = job.encoded()
        _ = try await producer.send(topic: topic, key: job.recordKey, value: value, headers: signing.headers(for: value))
    }
    func job(channel: String, sentAt: Int64, warmUp: Bool = false) -> PushJob {
        var job = PushJob(id: UUID().uuidString.lowercased(), appId: app, target: .channel(channel))
        // The fan-out's payload is the one bench-dispatcher gives h2load, so both send the simulator the same
        // bytes. The latency run's carries the job's id too, for the report to look up when the dispatcher
        // started it (its job status).
        var payload: [String: JSONValue] = ["aps": .object(["alert": .object(["title": .string("Benchmark"), "body": .string("Hello")])]),
                                            "sentAt": .number(Double(sentAt))]
        if command == "rate" { payload["jobId"] = .string(job.id) }
        if warmUp { payload["warmUp"] = .bool(true) }
        job.alert = .object(payload)
        return job
    }
    func now() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }
    if command == "fanout" {
        let one = job(channel: option("channel"), sentAt: now())
        try await send(one)
        print("produced job \(one.id) at \(now())")
    } else {
        let channels = Int(option("channels")) ?? 1, rate = Double(option("rate")) ?? 1000
        let warmUpCount = Int(rate * (Double(options["warm-up"] ?? "0") ?? 0))
        let total = warmUpCount + Int(rate * (Double(option("seconds")) ?? 5))
        let clock = ContinuousClock()
        let start = clock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for n in 0..<total {
                // An open-loop schedule: job n leaves at n / rate, however long earlier ones took.
                try await clock.sleep(until: start + .seconds(Double(n) / rate))
                let next = job(channel: "\(option("channel"))-\(n % channels)", sentAt: now(), warmUp: n < warmUpCount)
                group.addTask { try await send(next) }
            }
            try await group.waitForAll()
        }
        print("produced \(total) jobs in \(clock.now - start)")
    }
    await producer.close()

default:
    CommandLineTool.exitWithUsage(usage)
}
