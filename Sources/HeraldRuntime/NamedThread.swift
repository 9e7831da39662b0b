import Foundation
internal import CHeraldShims

extension Thread {
    /// A thread (not started yet) that the kernel knows by `name`, cut to Linux's 15 bytes: what `top -H`,
    /// `ps -L`, `perf` and `/proc/<pid>/task/*/comm` show. Foundation on Linux does not pass on a name set before
    /// `start()` (nor, reliably, one set right after it starts), so the thread names itself first thing.
    public static func named(_ name: String, _ body: @escaping @Sendable () -> Void) -> Thread {
        Thread {
            _ = herald_thread_set_name(name)
            body()
        }
    }
}
