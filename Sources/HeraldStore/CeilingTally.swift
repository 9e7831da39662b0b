import HeraldRedis
import HeraldRuntime

/// A public key's app-wide ceilings as one process counts them on a Redis Cluster.
///
/// There the ceiling's counter (in the key's slot) and a request's work (in its device's slot) cannot share a
/// script, and counting in Redis with every request would cost each a round trip more, all to the one node every
/// device of the app shares. So each process counts its requests here and sends the counts (`INCRBY`) at most once
/// per `interval`, learning from the answer what every process has sent. A request is refused when that total
/// plus what this process has counted since reaches the limit. A request that finds the last answer older than
/// `interval` asks Redis first (sending what is counted), so a process that was quiet never decides on an old total.
/// Exact with one process; with several, the ceiling can be passed by what the others counted in their last
/// `interval` (at the default 600,000 a minute, about 1,000 per 100 ms across all of them).
final class CeilingTally: Sendable {
    private struct Entry {
        /// The window the counter belongs to; entries of earlier windows go when a later one starts.
        var window: Int
        /// The counter's value in Redis at its last answer.
        var known: Int64 = 0
        /// Sent, not yet answered.
        var sending: Int64 = 0
        /// Counted here since the last send.
        var unsent: Int64 = 0
        var lastAnswer: ContinuousClock.Instant?
        /// A request is asking Redis for the total.
        var asking = false
        /// A task will send `unsent` once `interval` has passed.
        var sendScheduled = false

        var estimate: Int64 { known + sending + unsent }
    }

    let interval: Duration
    private let entries = Lock<[String: Entry]>([:])

    init(interval: Duration = .milliseconds(100)) {
        self.interval = interval
    }

    /// Counts one request in `ceiling` if it is within the limit and returns the ceiling's count with it; nil
    /// (nothing counted) when it is not.
    func claim(_ ceiling: RateLimiter.Counter, window: Int, ttlSeconds: Int, redis: RedisClient) async -> Int64? {
        let key = ceiling.redisKey
        let ask: Int64? = entries.withLock { entries in
            var entry: Entry
            if let known = entries[key] { entry = known } else {
                entries = entries.filter { $0.value.window >= window }
                entry = Entry(window: window)
            }
            defer { entries[key] = entry }
            guard !entry.asking, entry.lastAnswer.map({ .now - $0 >= interval }) ?? true else { return nil }
            entry.asking = true
            return take(&entry)
        }
        if let ask {
            // Unanswered (the counter's node failing over), the request is decided on what is known: the ceiling
            // bounds a whole app, and its node's failure should not refuse the devices whose own slots answer.
            try? await send(ask, to: key, ttlSeconds: ttlSeconds, redis: redis) { $0.asking = false }
        }
        let (count, schedule): (Int64?, Bool) = entries.withLock { entries in
            var entry = entries[key] ?? Entry(window: window)
            defer { entries[key] = entry }
            guard entry.estimate < ceiling.limit else { return (nil, false) }
            entry.unsent += 1
            let schedule = !entry.sendScheduled
            entry.sendScheduled = true
            return (entry.estimate, schedule)
        }
        if schedule { Task { await sendLater(key, ttlSeconds: ttlSeconds, redis: redis) } }
        return count
    }

    /// Takes back a claim whose request its own counter refused (it does not use up the ceiling), unless it has
    /// been sent already.
    func release(_ ceiling: RateLimiter.Counter) {
        entries.withLock { entries in
            guard var entry = entries[ceiling.redisKey], entry.unsent > 0 else { return }
            entry.unsent -= 1
            entries[ceiling.redisKey] = entry
        }
    }

    /// Moves what is counted here to what is being sent; returns it.
    private func take(_ entry: inout Entry) -> Int64 {
        let amount = entry.unsent
        (entry.sending, entry.unsent) = (entry.sending + amount, 0)
        return amount
    }

    /// Sends what was counted every `interval` until nothing more is; stops when the window's entry is gone, or
    /// when Redis does not answer (the next request's claim starts it again).
    private func sendLater(_ key: String, ttlSeconds: Int, redis: RedisClient) async {
        while true {
            try? await Task.sleep(for: interval)
            let amount: Int64? = entries.withLock { entries in
                guard var entry = entries[key] else { return nil }
                defer { entries[key] = entry }
                guard entry.unsent > 0 else {
                    entry.sendScheduled = false
                    return nil
                }
                return take(&entry)
            }
            guard let amount else { return }
            do { try await send(amount, to: key, ttlSeconds: ttlSeconds, redis: redis) { _ in } } catch {
                entries.withLock { $0[key]?.sendScheduled = false }
                return
            }
        }
    }

    /// Adds `amount` to the counter in Redis and takes the answer as the known total; `done` runs on the entry
    /// either way.
    private func send(_ amount: Int64, to key: String, ttlSeconds: Int, redis: RedisClient,
                      done: (inout Entry) -> Void) async throws {
        var total: Int64?
        defer {
            entries.withLock { entries in
                guard var entry = entries[key] else { return }
                entry.sending -= amount
                // A failed send goes again with the next: counted twice if Redis applied it, never lost.
                // An answer can overtake an earlier one: the counter only grows within its window.
                if let total { (entry.known, entry.lastAnswer) = (max(entry.known, total), .now) } else { entry.unsent += amount }
                done(&entry)
                entries[key] = entry
            }
        }
        let reply = try await redis.run(Self.add, keys: [key], args: [String(amount), String(ttlSeconds)])
        guard let value = reply.int else { throw StoreError.unexpectedReply("rate-limit ceiling") }
        total = value
    }

    /// KEYS: the counter. ARGV: the amount (0 to read it), the counter's TTL. Returns the counter's value.
    static let add = RedisScript(source: """
        local count = redis.call('INCRBY', KEYS[1], ARGV[1])
        -- Atomic here, so the window's first send alone needs to set the lifetime.
        if count == tonumber(ARGV[1]) then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
        return count
        """)
}
