import Foundation

/// A core dump of a process holding signing keys or API-key material would write them to disk wherever the
/// host collects cores; the services turn core dumps off for themselves at start.
public enum CoreDumps {
    /// Sets the process's core file limit (soft and hard) to 0. Returns false when the kernel refused.
    @discardableResult
    public static func disable() -> Bool {
        var none = rlimit(rlim_cur: 0, rlim_max: 0)
        return setrlimit(__rlimit_resource_t(RLIMIT_CORE.rawValue), &none) == 0
    }
}
