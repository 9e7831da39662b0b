import Foundation
import HeraldRuntime
import Testing

/// `Thread.named` gives the kernel the name, which `top -H`, `ps -L` and `perf` show.
@Suite struct NamedThreadTests {
    @Test(arguments: [("herald-apns", "herald-apns"), ("kafka-producer-metadata", "kafka-producer-")])
    func theKernelKnowsTheThreadByItsName(name: String, shown: String) async throws {
        let seen = Lock<String?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread.named(name) {
            let comm = try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)
            seen.withLock { $0 = comm?.trimmingCharacters(in: .newlines) }
            done.signal()
        }.start()
        #expect(done.wait(timeout: .now() + 10) == .success)
        #expect(seen.withLock { $0 } == shown)
    }
}
