import Foundation
import HeraldRuntime
import Synchronization

/// Counters a replay updates as it goes; the progress display reads them from its own task.
final class ReplayCounters: Sendable {
    let matched = Atomic<Int>(0)
    /// Handed to the producer (or, in a dry run, listed).
    let sent = Atomic<Int>(0)
    let already = Atomic<Int>(0)
    let skipped = Atomic<Int>(0)
    /// Chosen to be sent from the batch in hand and not handed to the producer yet.
    let waiting = Atomic<Int>(0)
}

/// What the broker has done with the jobs handed to it: acknowledged, and still awaiting an answer.
typealias PublishedCounts = @Sendable () -> (acknowledged: Int, inFlight: Int)

/// Shows a replay's progress on stderr: a bar redrawn in place on a terminal, a plain line every few seconds
/// otherwise (logs, CI), so output stays readable in both.
final class ProgressDisplay: Sendable {
    private let task: Lock<Task<Void, Never>?> = Lock(nil)
    private let isTerminal: Bool

    init() {
        isTerminal = isatty(STDERR_FILENO) == 1
    }

    /// Starts drawing. The fraction done (and the ETA) counts a dead letter once it is dealt with: left out,
    /// skipped, or its job acknowledged by the broker; one read but still waiting to be sent is not done.
    func start(name: String, reader: DLQReader, counters: ReplayCounters, published: @escaping PublishedCounts) {
        let terminal = isTerminal
        let expected = reader.expected, scannedCount = reader.scanned
        let started = ContinuousClock.now
        let drawing = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: terminal ? .milliseconds(200) : .seconds(2))
                if Task.isCancelled { break }
                let scanned = scannedCount.current
                let line = Self.line(name: name, scanned: scanned, expected: expected, counters: counters,
                                     published: published(), elapsed: ContinuousClock.now - started,
                                     terminal: terminal)
                FileHandle.standardError.write(Data((terminal ? "\r\u{1B}[2K" + line : line + "\n").utf8))
            }
        }
        task.withLock { $0 = drawing }
    }

    /// Stops drawing and leaves the terminal's cursor on a fresh line.
    func stop() async {
        guard let drawing = task.withLock({ $0.take() }) else { return }
        drawing.cancel()
        await drawing.value
        if isTerminal { FileHandle.standardError.write(Data("\r\u{1B}[2K".utf8)) }
    }

    static func line(name: String, scanned: Int, expected: Int64, counters: ReplayCounters,
                     published: (acknowledged: Int, inFlight: Int), elapsed: Duration, terminal: Bool) -> String {
        let seconds = max(elapsed.inSeconds, 0.001)
        let done = max(0, scanned - counters.waiting.load(ordering: .relaxed) - published.inFlight)
        let fraction = expected > 0 ? min(1, Double(done) / Double(expected)) : 1
        let rate = Double(published.acknowledged) / seconds
        let doneRate = Double(done) / seconds
        let remaining = max(0, Double(expected) - Double(done))
        let eta = doneRate > 0 ? formatDuration(remaining / doneRate) : "?"
        let counts = "\(published.acknowledged) re-published, \(published.inFlight) awaiting the broker, "
            + "\(counters.already.load(ordering: .relaxed)) already, \(counters.skipped.load(ordering: .relaxed)) skipped"
            + " · \(Int(rate))/s · ETA \(eta)"
        let percent = "\(Int(fraction * 100))%"
        guard terminal else {
            return "replay \(name): \(percent) of the dead letters done (\(done)/\(expected), \(scanned) read), \(counts)"
        }
        let width = 24
        let filled = Int(fraction * Double(width))
        let bar = String(repeating: "█", count: filled) + String(repeating: "░", count: width - filled)
        return "\(bar) \(percent.padding(4)) \(done)/\(expected) done · \(counts)"
    }

    static func formatDuration(_ seconds: Double) -> String {
        let whole = Int(seconds.rounded(.up))
        if whole < 60 { return "\(whole)s" }
        if whole < 3600 { return "\(whole / 60)m\(String(format: "%02d", whole % 60))s" }
        return "\(whole / 3600)h\(String(format: "%02d", whole % 3600 / 60))m"
    }
}
