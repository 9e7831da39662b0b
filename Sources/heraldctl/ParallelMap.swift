import Foundation

/// `items.map(transform)` spread over the machine's cores: decoding and encoding JSON is most of a replay's CPU
/// time. Runs on the calling thread plus Dispatch's workers, and returns when every item is done.
func parallelMap<T: Sendable, R: Sendable>(_ items: [T], _ transform: @Sendable (T) -> R) -> [R] {
    let chunks = min(items.count, ProcessInfo.processInfo.activeProcessorCount * 2)
    guard chunks > 1 else { return items.map(transform) }
    return Array(unsafeUninitializedCapacity: items.count) { buffer, initialized in
        // Each chunk initializes its own disjoint range of the buffer.
        nonisolated(unsafe) let output = buffer.baseAddress!
        DispatchQueue.concurrentPerform(iterations: chunks) { chunk in
            let range = (items.count * chunk / chunks)..<(items.count * (chunk + 1) / chunks)
            for index in range { (output + index).initialize(to: transform(items[index])) }
        }
        initialized = items.count
    }
}
