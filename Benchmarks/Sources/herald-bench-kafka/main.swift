// Measures records/s of keyless records produced through HeraldKafka's KafkaProducer (idempotent, acks=all), in two shapes:
//   unbounded  queue records as fast as the local buffer takes them, count broker acknowledgements
//   window     at most --window sends in flight, each awaited (what an HTTP ingest answering after the ack does)
// Usage: herald-bench-kafka --brokers host:port --topic T --mode unbounded|window [--records N] [--size B]
//        [--window W] [--linger-ms L]
// Prints one line: `mode=<mode> records=<n> seconds=<s> records_per_second=<r> failed=<f>`.
import Foundation
import HeraldKafka
import HeraldRuntime
import Synchronization

struct Options: Sendable {
    var brokers = "127.0.0.1:19111"
    var topic = "herald.bench"
    var mode = "unbounded"
    var records = 200_000
    var size = 300
    var window = 64
    var lingerMilliseconds = 1.0

    init(_ arguments: [String]) throws {
        var iterator = arguments.makeIterator()
        while let flag = iterator.next() {
            guard let value = iterator.next() else { throw ConfigurationError(flag, "missing value") }
            switch flag {
            case "--brokers": brokers = value
            case "--topic": topic = value
            case "--mode": mode = value
            case "--records": records = try Self.number(flag, value)
            case "--size": size = try Self.number(flag, value)
            case "--window": window = try Self.number(flag, value)
            case "--linger-ms":
                guard let parsed = Double(value), parsed >= 0 else { throw ConfigurationError(flag, "not a number") }
                lingerMilliseconds = parsed
            default: throw ConfigurationError(flag, "unknown option")
            }
        }
        guard ["unbounded", "window"].contains(mode) else { throw ConfigurationError("--mode", "unbounded or window") }
    }

    private static func number(_ flag: String, _ value: String) throws -> Int {
        guard let parsed = Int(value), parsed > 0 else { throw ConfigurationError(flag, "expected a positive number") }
        return parsed
    }
}

/// Counts acknowledgements from the producer's thread and wakes the main task when all are in.
final class Tally: Sendable {
    private let state = Lock<(done: Int, failed: Int, waiter: CheckedContinuation<Void, Never>?)>((0, 0, nil))
    let expected: Int

    init(expected: Int) { self.expected = expected }

    func record(_ result: Result<KafkaDeliveryReport, KafkaError>) {
        let waiter: CheckedContinuation<Void, Never>? = state.withLock { state in
            state.done += 1
            if case .failure = result { state.failed += 1 }
            guard state.done == expected else { return nil }
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }

    func waitForAll() async {
        await withCheckedContinuation { continuation in
            let finished = state.withLock { state in
                if state.done == expected { return true }
                state.waiter = continuation
                return false
            }
            if finished { continuation.resume() }
        }
    }

    var failed: Int { state.withLock { $0.failed } }
}

/// Queues every record at once (retrying when the local buffer is full) and waits for all acknowledgements.
func produceUnbounded(_ producer: KafkaProducer, _ options: Options, value: [UInt8]) async -> Int {
    let tally = Tally(expected: options.records)
    for _ in 0..<options.records {
        while !enqueue(producer, topic: options.topic, value: value, tally: tally) {
            // The local buffer is full: give the broker time to acknowledge some records.
            usleep(200)
        }
    }
    await tally.waitForAll()
    return tally.failed
}

/// False when the local buffer is full; other failures count as failed records.
func enqueue(_ producer: KafkaProducer, topic: String, value: [UInt8], tally: Tally) -> Bool {
    do {
        try producer.send(topic: topic, key: nil, value: value) { tally.record($0) }
        return true
    } catch {
        if error.code == .queueFull { return false }
        tally.record(.failure(error))
        return true
    }
}

final class WindowCounters: Sendable {
    let next = Atomic(0)
    let failures = Atomic(0)
}

/// `options.window` tasks, each sending one record and awaiting its acknowledgement before the next.
func produceWindowed(_ producer: KafkaProducer, _ options: Options, value: [UInt8]) async -> Int {
    let counters = WindowCounters()
    await withTaskGroup(of: Void.self) { group in
        for _ in 0..<options.window {
            group.addTask {
                while true {
                    guard counters.next.add(1, ordering: .relaxed).oldValue < options.records else { return }
                    do {
                        _ = try await producer.send(topic: options.topic, key: nil, value: value)
                    } catch {
                        counters.failures.add(1, ordering: .relaxed)
                    }
                }
            }
        }
    }
    return counters.failures.load(ordering: .relaxed)
}

func run(_ options: Options) async throws {
    let logger = Logger(label: "herald-bench-kafka", minimumLevel: .warning)
    let producer = try KafkaProducer(
        configuration: KafkaProducerConfiguration(
            kafka: KafkaConfiguration(brokerList: options.brokers, clientID: "bench"),
            linger: .microseconds(Int64(options.lingerMilliseconds * 1000))),
        logger: logger)
    let value = [UInt8](repeating: UInt8(ascii: "x"), count: options.size)
    // Connect, learn the partitions and get a producer id before the clock starts.
    _ = try await producer.send(topic: options.topic, key: "warm-up", value: value)

    let clock = ContinuousClock()
    let start = clock.now
    let failed = options.mode == "unbounded"
        ? await produceUnbounded(producer, options, value: value)
        : await produceWindowed(producer, options, value: value)
    let elapsed = clock.now - start
    await producer.close()
    let seconds = elapsed.inSeconds
    print("mode=\(options.mode) records=\(options.records) seconds=\(String(format: "%.3f", seconds)) "
          + "records_per_second=\(Int(Double(options.records) / seconds)) failed=\(failed)")
}

do {
    try await run(Options(Array(CommandLine.arguments.dropFirst())))
} catch {
    FileHandle.standardError.write(Data("herald-bench-kafka: \(error)\n".utf8))
    exit(1)
}
