import Foundation
import HeraldRuntime
import HeraldTestSupport

/// Mixed load against a running Herald stack for a bounded time at a bounded rate, then an accounting of every
/// accepted push (delivered at the simulator, dead-lettered, or its token unregistered), with latencies and the
/// RSS of each process. Started by scripts/soak, which runs the stack.
@main
struct HeraldSoak {
    static func main() async {
        let arguments = CommandLine.arguments.dropFirst()
        switch arguments.first {
        case "rules":
            print(TokenClass.rules)
        case "run":
            do {
                let options = try Options(arguments.dropFirst())
                exit(try await run(options) ? 0 : 1)
            } catch let error as ConfigurationError {
                FileHandle.standardError.write(Data("herald-soak: \(error)\n".utf8))
                exit(2)
            } catch {
                FileHandle.standardError.write(Data("herald-soak: \(error)\n".utf8))
                exit(1)
            }
        default:
            print(Options.usage)
            exit(arguments.first == "--help" ? 0 : 2)
        }
    }

    /// Runs the load and the accounting; true when nothing failed.
    static func run(_ options: Options) async throws -> Bool {
        let tokens = TokenBook()
        let ledger = Ledger()
        let channels = try await onThread { try subscribeChannels(options, tokens: tokens) }
        say("subscribed \(channels.count) channels × \(options.subscribersPerChannel) tokens; "
            + "load for \(Int(options.seconds)) s at \(Int(options.rate)) req/s on \(options.workers) connections")

        let start = ContinuousClock.now
        let end = start + .seconds(options.seconds)
        let memory = MemoryWatch(options.processes)
        await withTaskGroup(of: Void.self) { group in
            for number in 0..<options.workers {
                group.addTask {
                    let stats = try? await onThread {
                        Worker(number: number, options: options, ledger: ledger, tokens: tokens, channels: channels)
                            .run(start: start, end: end)
                    }
                    ledger.merge(stats ?? [])
                }
            }
            group.addTask {
                try? await Task.sleep(until: start + .seconds(options.warmUp), clock: .continuous)
                memory.sample(.warmUp)
                while true {
                    let remaining = end - .seconds(1) - ContinuousClock.now
                    guard remaining > .zero else { break }
                    try? await Task.sleep(for: min(.seconds(5), remaining))
                    memory.sample(.peak)
                }
            }
            await group.waitForAll()
        }
        memory.sample(.end)
        let loadSeconds = (ContinuousClock.now - start).inSeconds
        let events = ledger.events
        say("load done: \(events.count) events accepted; waiting up to \(Int(options.drainTimeoutSeconds)) s for every push to settle")

        let settlement = try await Settlement.open(options)
        let drainStart = ContinuousClock.now
        var tally: Tally
        while true {
            try await settlement.refresh()
            tally = Tally(events: events, tokens: tokens, settlement: settlement)
            if tally.lost == 0 || ContinuousClock.now - drainStart > .seconds(options.drainTimeoutSeconds) { break }
            try await Task.sleep(for: .seconds(1))
        }
        let drained = (ContinuousClock.now - drainStart).inSeconds
        // Late duplicates would arrive after the last expected push: give them a moment, then count again.
        try await Task.sleep(for: .seconds(3))
        try await settlement.refresh()
        tally = Tally(events: events, tokens: tokens, settlement: settlement)
        memory.sample(.drained)
        await settlement.close()

        return report(options, stats: ledger.stats, loadSeconds: loadSeconds, drainSeconds: drained, tally: tally,
                      settlement: settlement, memory: memory)
    }

    static func report(_ options: Options, stats: [KindStats], loadSeconds: Double, drainSeconds: Double, tally: Tally,
                       settlement: Settlement, memory: MemoryWatch) -> Bool {
        var failures: [String] = []
        var notes: [String] = []
        var out = "\n## Soak report\n\n"
        out += "load: \(format(loadSeconds, 1)) s, target \(Int(options.rate)) req/s on \(options.workers) connections; "
        out += "settled \(format(drainSeconds, 1)) s after the load stopped\n\n"
        out += "| request | count | req/s | p50 ms | p99 ms | max ms | unexpected answers |\n|---|---:|---:|---:|---:|---:|---|\n"
        var total = 0
        for kind in Kind.allCases {
            let kindStats = stats[kind.rawValue]
            let sorted = kindStats.latenciesMs.sorted()
            total += sorted.count
            let unexpected = kindStats.unexpected.sorted { $0.key < $1.key }.map { "\($0.value)× \($0.key)" }.joined(separator: ", ")
            if !kindStats.unexpected.isEmpty { failures.append("\(kind.name): unexpected answers \(unexpected)") }
            out += "| \(kind.name) | \(sorted.count) | \(format(Double(sorted.count) / loadSeconds, 1)) | "
            out += "\(format(percentile(sorted, 0.50), 2)) | \(format(percentile(sorted, 0.99), 2)) | \(format(sorted.last ?? 0, 1)) | "
            out += "\(unexpected.isEmpty ? "none" : unexpected) |\n"
        }
        out += "| all | \(total) | \(format(Double(total) / loadSeconds, 1)) | | | | |\n\n"

        out += "| process | RSS after warm-up (\(Int(options.warmUp)) s) | RSS at end of load | growth | peak during load | RSS after drain |\n"
        out += "|---|---:|---:|---:|---:|---:|\n"
        for (name, _) in options.processes {
            let warm = memory.value(name, .warmUp), end = memory.value(name, .end)
            let growth = warm > 0 ? (Double(end) / Double(warm) - 1) * 100 : 0
            out += "| \(name) | \(mib(warm)) | \(mib(end)) | \(format(growth, 1, sign: true)) % | "
            out += "\(mib(max(memory.value(name, .peak), warm, end))) | \(mib(memory.value(name, .drained))) |\n"
            if ["ingest", "dispatcher"].contains(name), growth > options.rssGrowthLimitPercent {
                let text = "\(name) RSS grew \(format(growth, 1)) % after warm-up (limit \(format(options.rssGrowthLimitPercent, 0)) %)"
                if options.enforceRSS { failures.append(text) } else { notes.append("reported, not enforced: \(text)") }
            }
        }
        for note in notes { out += "\n(\(note))\n" }

        let byClass = { (kind: TokenClass) in tally.expectedByClass[kind] ?? 0 }
        out += "\n| pushes | count |\n|---|---:|\n"
        out += "| events accepted (202) | \(tally.events) |\n"
        out += "| pushes expected | \(tally.expected) |\n"
        out += "| … to tokens APNs accepts (incl. \(byClass(.transient)) answered 503 twice first) | \(byClass(.normal) + byClass(.transient)) |\n"
        out += "| … to tokens APNs rejects for good (400 TopicDisallowed / 503 on every attempt) | \(byClass(.rejected)) / \(byClass(.exhausted)) |\n"
        out += "| … to unregistered tokens (410) | \(byClass(.unregistered)) |\n"
        out += "| delivered at the simulator | \(tally.delivered) |\n"
        out += "| dead-lettered | \(tally.deadLettered) |\n"
        out += "| token removed after 410 | \(tally.unregistered) |\n"
        out += "| 503 answers from the simulator (each push retried up to 5 attempts) | \(settlement.rejectedByStatus[503] ?? 0) |\n"
        out += "| settled differently from their token's class | \(tally.otherOutcome) |\n"
        out += "| lost | \(tally.lost) |\n"
        out += "| duplicates (bound: 0 without a crash or restart) | \(tally.duplicates) |\n"
        out += "| records of no accepted event | \(tally.unaccounted) |\n"
        if tally.lost > 0 { failures.append("\(tally.lost) accepted pushes lost") }
        if tally.duplicates > 0 { failures.append("\(tally.duplicates) duplicate pushes") }
        if settlement.foreign > 0 { failures.append("\(settlement.foreign) records without a soak event id or token") }

        out += "\nresult: " + (failures.isEmpty ? "PASS" : "FAIL\n" + failures.map { "- \($0)" }.joined(separator: "\n")) + "\n"
        print(out, terminator: "")
        return failures.isEmpty
    }

    static func say(_ text: String) { FileHandle.standardError.write(Data("herald-soak: \(text)\n".utf8)) }
}

func percentile(_ sorted: [Double], _ fraction: Double) -> Double {
    guard !sorted.isEmpty else { return 0 }
    return sorted[min(sorted.count - 1, Int((Double(sorted.count) * fraction).rounded(.up)) - 1)]
}

func format(_ value: Double, _ decimals: Int, sign: Bool = false) -> String {
    String(format: "%\(sign ? "+" : "").\(decimals)f", value)
}

func mib(_ kilobytes: Int) -> String { kilobytes > 0 ? format(Double(kilobytes) / 1024, 1) + " MiB" : "n/a" }

/// RSS samples of the stack's processes (VmRSS from /proc, in KiB).
final class MemoryWatch: Sendable {
    enum Point: Hashable, Sendable { case warmUp, peak, end, drained }

    private let processes: [(name: String, pid: Int32)]
    private let samples = Lock<[String: [Point: Int]]>([:])

    init(_ processes: [(name: String, pid: Int32)]) { self.processes = processes }

    /// Records every process's RSS at `point` (`peak` keeps the largest value seen).
    func sample(_ point: Point) {
        for (name, pid) in processes {
            let rss = Self.rss(pid)
            samples.withLock { all in
                if point == .peak {
                    all[name, default: [:]][.peak] = max(all[name]?[.peak] ?? 0, rss)
                } else {
                    all[name, default: [:]][point] = rss
                }
            }
        }
    }

    func value(_ name: String, _ point: Point) -> Int { samples.withLock { $0[name]?[point] ?? 0 } }

    private static func rss(_ pid: Int32) -> Int {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = text.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return 0 }
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0
    }
}
