import HeraldRuntime
@testable import HeraldKafka
import Testing

@Suite("The library's own threads")
struct OwnedThreadTests {
    /// `wake` touches what its owner destroys once the thread stopped (rd_kafka_yield on a handle): stopping again,
    /// as a `deinit` after `close` does, must not call it, nor may a job submitted after the stop.
    @Test func wakeIsNotCalledAfterTheFirstStop() async throws {
        let wakes = Lock(0), ran = Lock(0)
        let thread = OwnedThread(name: "owned-thread-test", wake: { wakes.withLock { $0 += 1 } })
        #expect(thread.submit { ran.withLock { $0 += 1 } })
        #expect(wakes.withLock { $0 } == 1)
        thread.stop()
        #expect(wakes.withLock { $0 } == 2)
        #expect(ran.withLock { $0 } == 1, "the queued job ran before the thread ended")
        thread.stop()
        #expect(!thread.submit { ran.withLock { $0 += 1 } })
        #expect(wakes.withLock { $0 } == 2, "no wake after the first stop")
        await #expect(throws: KafkaError.self) { try await thread.run { () throws(KafkaError) in 1 } }
    }
}
