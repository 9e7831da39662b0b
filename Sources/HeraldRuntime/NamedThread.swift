import Foundation

extension Thread {
    /// A thread (not started yet) that the kernel knows by `name`, cut to Linux's 15 bytes: what `top -H`,
    /// `ps -L`, `perf` and `/proc/<pid>/task/*/comm` show. Foundation on Linux keeps a name set before `start()` to
    /// itself, and only a thread can name itself there, so this one does so first thing.
    public static func named(_ name: String, _ body: @escaping @Sendable () -> Void) -> Thread {
        let kernelName = String(decoding: name.utf8.prefix(15), as: UTF8.self)
        return Thread {
            Thread.current.name = kernelName
            body()
        }
    }
}
