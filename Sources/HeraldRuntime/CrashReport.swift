internal import CHeraldShims

/// One JSON line on stderr when the process dies of a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT):
/// which signal, sent by the kernel or another process, the fault address, the thread that crashed (its name:
/// `kafka-consumer`, librdkafka's `rdk:main`…) and the raw backtrace. The log lines still buffered are written
/// first. A fault then goes on to whatever handled it before (the Swift runtime's backtracer, which prints its
/// report, or a sanitizer); a signal sent by another process kills the process as it would have.
public enum CrashReport {
    /// The writer whose queued lines the handler writes out; set once, before the handler is installed.
    nonisolated(unsafe) private static var writer: LogWriter?

    /// Installs the handler; `label` names the process in the line, as a logger's label does.
    public static func install(label: String, writer: LogWriter = .standardError) {
        Self.writer = writer
        _ = herald_crash_handler_install(label, { CrashReport.writer?.writeQueuedBeforeCrash() })
    }
}
