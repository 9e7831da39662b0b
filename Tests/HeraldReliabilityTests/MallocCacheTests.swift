import Foundation
import HeraldRuntime
import HeraldTestSupport
import Testing

/// herald-ingest runs with glibc's larger per-thread malloc cache (`MallocCache`: it executes itself again with
/// `GLIBC_TUNABLES` set) and leaves an operator's own `GLIBC_TUNABLES` alone.
@Suite(.serialized) struct MallocCacheTests {
    @Test func ingestRestartsItselfWithTheLargerCache() async throws {
        let ingest = try await ReliabilityIngest()
        #expect(try Self.environment(of: ingest.child.pid)["GLIBC_TUNABLES"] == MallocCache.tunables)
        #expect(try await ingest.request("GET", "/readyz").status == 200)
        await ingest.stop()
    }

    @Test func anOperatorsTunablesAreKept() async throws {
        let own = "glibc.malloc.arena_max=2"
        let ingest = try await ReliabilityIngest(extra: ["GLIBC_TUNABLES": own])
        #expect(try Self.environment(of: ingest.child.pid)["GLIBC_TUNABLES"] == own)
        await ingest.stop()
    }

    /// The environment a process was started (or last executed) with.
    static func environment(of pid: Int32) throws -> [String: String] {
        let raw = try Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/environ"))
        var environment: [String: String] = [:]
        for entry in raw.split(separator: 0) {
            let text = String(decoding: entry, as: UTF8.self)
            guard let equals = text.firstIndex(of: "=") else { continue }
            environment[String(text[..<equals])] = String(text[text.index(after: equals)...])
        }
        return environment
    }
}
