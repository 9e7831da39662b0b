import Dispatch
import Foundation
import Testing
@testable import HeraldRedis

/// The pool's queue on its own, with this test's threads as the connection workers (no Redis needed).
@Suite struct RedisRequestQueueTests {
    /// A worker that takes a full batch off a longer queue wakes an idle one for the rest: a call queued behind a
    /// batch that Redis holds is answered on another connection meanwhile, not after it. Whether the woken worker
    /// takes its batch before the second call is queued is up to the scheduler, so the test runs ten rounds: only
    /// rounds where it is slower than the second `enqueue` (most of them) can show the wait.
    @Test func whatAFullBatchLeavesGoesToAnIdleWorker() async throws {
        for _ in 0..<10 { #expect(try await callBehindAFullBatchIsAnsweredBesideIt()) }
    }

    private func callBehindAFullBatchIsAnsweredBesideIt() async throws -> Bool {
        let queue = RedisRequestQueue(workerCount: 2, maxQueuedCommands: 10_000)
        let bigBatchHeld = DispatchSemaphore(value: 0)
        let smallAnswered = DispatchSemaphore(value: 0)
        for index in 0..<2 {
            Thread {
                while let batch = queue.nextBatch(worker: index) {
                    // The full batch is "at Redis" until the test lets it go.
                    if batch.contains(where: { $0.replyCount == RedisRequestQueue.maxBatchCommands }) { bigBatchHeld.wait() }
                    for request in batch {
                        request.succeed(Array(repeating: .status("OK"), count: request.replyCount))
                        if request.replyCount == 1 { smallAnswered.signal() }
                    }
                }
            }.start()
        }
        try await Task.sleep(for: .milliseconds(100)) // both threads wait on the empty queue

        let deadline = ContinuousClock.now + .seconds(10)
        async let replies: [[RedisValue]] = withCheckedThrowingContinuation { continuation in
            let gather = RedisGather(parts: 2, continuation: continuation)
            let requests = [RedisRequestQueue.maxBatchCommands, 1].enumerated().map { index, count in
                RedisRequest(payload: [], replyCount: count, deadline: deadline, completion: .part(gather, index))
            }
            // Back to back: the second call is usually queued before the woken worker takes the first.
            let refusals = requests.map { queue.enqueue($0) }
            #expect(refusals.allSatisfy { $0 == nil })
        }
        let answeredBeside = smallAnswered.wait(timeout: .now() + .seconds(2)) == .success
        bigBatchHeld.signal()
        #expect(try await replies.map(\.count) == [RedisRequestQueue.maxBatchCommands, 1])
        queue.shutdown()
        await queue.waitUntilStopped()
        return answeredBeside
    }
}
