import Dispatch
import HeraldRuntime
internal import CHeraldShims

/// Gives the allocator's free memory back to the system every `interval`, from a timer on a dispatch queue of its
/// own (a trim walks every free chunk: a few milliseconds of CPU, kept off Swift's cooperative pool).
///
/// glibc keeps what a burst freed in its per-thread arenas: after the dispatcher catches up on a backlog (a
/// consumer restart, a rebalance, a broker outage) with `maxInFlightJobs` jobs at once, its RSS would stay at that
/// peak for good, hiding the memory actually in use.
struct HeapTrimmer: Service {
    var interval: Duration = .seconds(30)

    /// Trims until cancelled; the first trim comes after one `interval`. A trim under way when cancelled finishes
    /// on its queue.
    func run() async {
        let nanoseconds = Int(interval.inNanoseconds)
        let timer = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "herald.heap-trimmer"))
        timer.schedule(deadline: .now() + .nanoseconds(nanoseconds), repeating: .nanoseconds(nanoseconds))
        timer.setEventHandler { _ = herald_malloc_trim() }
        timer.resume()
        await waitForCancellation()
        timer.cancel()
    }
}
