import Foundation

/// Writes log lines for every thread of the process without ever making one of them wait on the output.
///
/// A caller only appends its finished line to a bounded buffer under a short lock: no system call, no lock held
/// across I/O. One thread of the writer's own takes the whole buffer every few milliseconds and writes it out in
/// one go. When the output stalls (a full pipe nobody reads) and the buffer is full, new lines are dropped and
/// counted (`herald_log_lines_dropped_total`), and the next batch written starts with a line saying how many.
/// Whatever is buffered is written before the process exits (`exit`, or the end of `main`).
public final class LogWriter: Sendable {
    /// The process's writer, onto stderr, started on first use; what it holds is written when the process exits.
    public static let standardError: LogWriter = {
        let writer = LogWriter(descriptor: 2)
        atexit { LogWriter.standardError.flush(timeout: .seconds(2)) }
        return writer
    }()

    /// Lines dropped because the buffer was full, since the writer started.
    public var droppedLines: UInt64 { state.withLock { $0.droppedTotal } }

    private struct State {
        var pending: [UInt8] = []
        var dropped: UInt64 = 0
        var droppedTotal: UInt64 = 0
        /// True from the moment the drain thread takes a batch until it has written it.
        var writing = false
    }

    private let descriptor: Int32
    private let capacity: Int
    private let interval: Duration
    private let state = Lock(State())
    private let droppedCounter = MetricsRegistry.shared.counter(
        "herald_log_lines_dropped_total", help: "Log lines dropped because the log output could not keep up")

    /// A writer onto `descriptor` that buffers at most `capacity` bytes and writes every `interval`.
    public init(descriptor: Int32, capacity: Int = 4 << 20, interval: Duration = .milliseconds(5)) {
        self.descriptor = descriptor
        self.capacity = capacity
        self.interval = interval
        state.withLock { $0.pending.reserveCapacity(min(capacity, 64 << 10)) }
        let thread = Thread.named("herald-log") { [self] in drain() }
        thread.start()
    }

    /// Queues one whole line (with its newline); never blocks on the output.
    public func write(_ line: [UInt8]) {
        let dropped = state.withLock { state -> Bool in
            guard state.pending.count + line.count <= capacity else {
                state.dropped += 1
                state.droppedTotal += 1
                return true
            }
            state.pending.append(contentsOf: line)
            return false
        }
        if dropped { droppedCounter.increment() }
    }

    /// From a fatal-signal handler: writes out what is queued, at once, if no other thread holds the buffer
    /// (never waits; allocates nothing). The lines the drain thread was writing at that instant may be lost.
    public func writeQueuedBeforeCrash() {
        _ = state.withLockIfAvailable { state in
            state.pending.withUnsafeBytes { bytes in
                guard let base = bytes.baseAddress, !bytes.isEmpty else { return }
                _ = Glibc.write(descriptor, base, bytes.count)
            }
            state.pending.removeAll(keepingCapacity: true)
        }
    }

    /// Waits until everything queued so far has been written, or `timeout` has passed (a stalled output).
    public func flush(timeout: Duration) {
        let deadline = ContinuousClock.now + timeout
        while state.withLock({ !$0.pending.isEmpty || $0.writing || $0.dropped > 0 }), ContinuousClock.now < deadline {
            Thread.sleep(forTimeInterval: 0.001)
        }
    }

    private func drain() {
        var batch: [UInt8] = []
        let pause = interval.inMicroseconds
        while true {
            let dropped = state.withLock { state -> UInt64 in
                swap(&batch, &state.pending)
                state.writing = !batch.isEmpty || state.dropped > 0
                defer { state.dropped = 0 }
                return state.dropped
            }
            if dropped > 0 {
                writeOut(Logger.line(level: .warning, label: "herald.log", message: "log lines dropped",
                                     fields: ["log.dropped": String(dropped)]))
            }
            if !batch.isEmpty {
                writeOut(batch)
                batch.removeAll(keepingCapacity: true)
            }
            state.withLock { $0.writing = false }
            usleep(useconds_t(pause))
        }
    }

    /// Blocking write of all of `bytes`; gives up on an output that is gone (the lines are lost with it).
    private func writeOut(_ bytes: [UInt8]) {
        var offset = 0
        while offset < bytes.count {
            let written = bytes.withUnsafeBytes { buffer in
                Foundation.write(descriptor, buffer.baseAddress! + offset, buffer.count - offset)
            }
            if written < 0 {
                if errno == EINTR { continue }
                guard errno == EAGAIN else { return }
                var ready = pollfd(fd: descriptor, events: Int16(POLLOUT), revents: 0)
                _ = poll(&ready, 1, -1) // an output opened non-blocking: wait for room rather than spin
                continue
            }
            offset += written
        }
    }
}
