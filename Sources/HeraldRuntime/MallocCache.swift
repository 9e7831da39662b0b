import Foundation

/// glibc's per-thread cache of freed memory ("tcache"), sized for a server that allocates in bursts.
///
/// By default the cache keeps 7 freed chunks per size class. An HTTP loop answers several requests per turn and each
/// request allocates and frees about fifty small objects, so most frees overflowed the cache into malloc's shared
/// bins and most allocations took the slow path. 64 per class keeps a loop turn's frees cached (BENCHMARKS.md has
/// the measurement). At most 64 chunks of each size up to 1 KiB stay cached per thread: ~2 MiB a thread at worst.
///
/// glibc reads the size only from `GLIBC_TUNABLES` when a process starts, so a process started without that
/// variable executes itself again, at once, with it set (same pid, arguments and environment otherwise). A
/// `GLIBC_TUNABLES` the operator set, even to nothing, is left as it is.
public enum MallocCache {
    public static let tunables = "glibc.malloc.tcache_count=64"

    /// Call first thing in `main`, before any work: on success it does not return (the process starts over).
    public static func enlargeByReexecuting() {
        guard getenv("GLIBC_TUNABLES") == nil else { return }
        setenv("GLIBC_TUNABLES", tunables, 1)
        execv("/proc/self/exe", CommandLine.unsafeArgv)
        // No /proc (or exec refused): carry on with glibc's defaults, without passing the variable on.
        unsetenv("GLIBC_TUNABLES")
    }
}
