import Foundation
import HeraldKafka
import HeraldRedis
import HeraldRuntime

/// What a replay has re-published, kept in Redis so that running the same replay again (or resuming one that
/// was stopped) sends nothing twice: a set `herald:replay:{<name>}:sent` of `<partition>:<offset>` members of
/// the dead-letter topic.
///
/// A member is added as soon as the broker acknowledged its job: the producer's delivery callback hands it to
/// `run()`, which adds whatever has accumulated in one `SADD` per round trip. So a replay killed outright can
/// send again at most the jobs handed to the producer and not yet recorded (those in flight, at most
/// `ReplayCommand.maxInFlight`, and one round trip's worth of acknowledged ones); one stopped with SIGINT/SIGTERM
/// waits for its acknowledgements and records them all.
final class ReplayLedger: Sendable {
    /// Kept 30 days after the replay's last write; a replay run again later than that starts afresh.
    static let retention = 30 * 86_400

    let key: String
    private let redis: RedisClient
    private let state = Lock(State())

    private struct State {
        var acknowledged: [String] = []
        var inFlight = 0
        var acknowledgedCount = 0
        var recorded = 0
        var failures: [String: Int] = [:]
        /// Jobs not acknowledged since the last one that was, and once Kafka is taken to have stopped (for good:
        /// a later acknowledgement does not undo it) how many and the last one's error.
        var failuresInARow = 0
        var kafkaStopped: (count: Int, lastError: String)?
        /// The jobs still unanswered were given up (`waitForAnswers`): later answers are ignored.
        var abandoned = false
        var finished = false
        var recordingFailed = false
        var recorder: CheckedContinuation<Void, Never>?
        var sender: (below: Int, continuation: CheckedContinuation<Void, Never>)?

        /// Fewer than `limit` sent and not recorded (awaiting the broker's answer, or acknowledged and not yet in
        /// Redis), or recording has failed (the sender then stops).
        func senderMayGo(below limit: Int) -> Bool { inFlight + acknowledgedCount - recorded < limit || recordingFailed }
    }

    init(name: String, redis: RedisClient) {
        key = "herald:replay:{\(name)}:sent"
        self.redis = redis
    }

    static func member(partition: Int32, offset: Int64) -> String { "\(partition):\(offset)" }

    /// Which of `members` earlier runs of this replay have re-published.
    func alreadySent(_ members: [String]) async throws -> Set<String> {
        guard !members.isEmpty else { return [] }
        let reply = try await redis.command(["SMISMEMBER", key] + members)
        guard let flags = reply.array, flags.count == members.count else {
            throw OperatorError("Redis: unexpected answer to SMISMEMBER \(key)")
        }
        return Set(zip(members, flags).compactMap { $1.int == 1 ? $0 : nil })
    }

    /// Call before handing a job to the producer.
    func sending() {
        state.withLock { $0.inFlight += 1 }
    }

    /// The producer's delivery callback (on its thread): must not block.
    func delivered(_ member: String, _ result: Result<KafkaDeliveryReport, KafkaError>) {
        update { state in
            guard !state.abandoned else { return }
            state.inFlight -= 1
            switch result {
            case .success:
                state.acknowledged.append(member)
                state.acknowledgedCount += 1
                state.failuresInARow = 0
            case .failure(let error): Self.failed(error, &state)
            }
        }
    }

    /// The producer refused the job outright (nothing was queued).
    func notSent(_ error: KafkaError) {
        update { state in
            guard !state.abandoned else { return }
            state.inFlight -= 1
            Self.failed(error, &state)
        }
    }

    private static func failed(_ error: KafkaError, _ state: inout State) {
        state.failures[error.code.name, default: 0] += 1
        state.failuresInARow += 1
        if state.kafkaStopped == nil, error.code == .messageTimedOut || state.failuresInARow >= failuresToStop {
            state.kafkaStopped = (state.failuresInARow, error.code.name)
        }
    }

    /// After this many jobs in a row were refused, or one went unanswered for the whole message timeout, Kafka is
    /// taken to have stopped taking them (a broker down, write access revoked): sending more would only have each
    /// one wait out the timeout.
    static let failuresToStop = 20

    /// The jobs not acknowledged in a row and the last one's error when Kafka was taken to have stopped; nil before.
    var stoppedAcknowledging: (count: Int, lastError: String)? { state.withLock { $0.kafkaStopped } }

    /// Waits until every job sent is answered; once Kafka is taken to have stopped (before or meanwhile), at most
    /// `grace` more (a broker that stopped answering on an open connection has librdkafka fail the last jobs one by
    /// one, for minutes), and the jobs still unanswered then count as `no_answer`.
    func waitForAnswers(grace: Duration) async {
        var graceEnds: ContinuousClock.Instant?
        while state.withLock({ $0.inFlight }) > 0 {
            if graceEnds == nil, stoppedAcknowledging != nil { graceEnds = .now + grace }
            if let graceEnds, ContinuousClock.now >= graceEnds {
                state.withLock { state in
                    state.failures["no_answer", default: 0] += state.inFlight
                    state.inFlight = 0
                    state.abandoned = true
                }
                return
            }
            try? await Task.sleep(for: .milliseconds(50))
        }
    }

    /// Waits until fewer than `limit` jobs are unrecorded: awaiting their acknowledgement, or acknowledged and not yet
    /// recorded in Redis (a Redis slower than the broker must slow the sending, or a crash would send more again).
    /// Returns at once when recording has failed.
    func waitForUnrecorded(below limit: Int) async {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> Bool in
                if state.senderMayGo(below: max(limit, 1)) { return true }
                state.sender = (max(limit, 1), continuation)
                return false
            }
            if ready { continuation.resume() }
        }
    }

    /// No more jobs will be sent: `run()` returns once it has recorded every acknowledgement.
    func finish() {
        let wake = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.finished = true
            defer { state.recorder = nil }
            return state.recorder
        }
        wake?.resume()
    }

    /// Records acknowledged jobs in Redis until `finish()`; throws when Redis fails or refuses a write (`OOM`, an
    /// ACL without `SADD`), and `hasFailed` then tells the sender to stop: what it sent from then on would not be
    /// recorded, and a rerun would send it again.
    func run() async throws {
        do {
            while let members = await next() {
                for start in stride(from: 0, to: members.count, by: 1000) {
                    let chunk = Array(members[start..<min(start + 1000, members.count)])
                    let replies = try await redis.pipeline([["SADD", key] + chunk, ["EXPIRE", key, String(Self.retention)]])
                    for case .error(let message) in replies { throw RedisError.fromReply(message) }
                }
                update { $0.recorded += members.count }
            }
        } catch {
            update { $0.recordingFailed = true }
            throw error
        }
    }

    /// True once `run()` has failed: nothing acknowledged is recorded any more.
    var hasFailed: Bool { state.withLock { $0.recordingFailed } }

    /// Jobs the broker acknowledged, and those handed to it and not answered yet.
    var progress: (acknowledged: Int, inFlight: Int) {
        state.withLock { ($0.acknowledgedCount, $0.inFlight) }
    }

    /// Jobs the broker acknowledged, those recorded in Redis, and failures by Kafka error name.
    var outcome: (acknowledged: Int, recorded: Int, failures: [String: Int]) {
        state.withLock { ($0.acknowledgedCount, $0.recorded, $0.failures) }
    }

    /// Everything acknowledged so far, waiting for at least one; nil once finished and drained.
    private func next() async -> [String]? {
        while true {
            let taken = state.withLock { state -> (members: [String], finished: Bool) in
                defer { state.acknowledged.removeAll(keepingCapacity: true) }
                return (state.acknowledged, state.finished)
            }
            if !taken.members.isEmpty { return taken.members }
            if taken.finished { return nil }
            await withCheckedContinuation { continuation in
                let ready = state.withLock { state -> Bool in
                    if !state.acknowledged.isEmpty || state.finished { return true }
                    state.recorder = continuation
                    return false
                }
                if ready { continuation.resume() }
            }
        }
    }

    /// Applies `change`, then wakes the recorder and the sender if it let them go on.
    private func update(_ change: (inout State) -> Void) {
        let wake = state.withLock { state in
            change(&state)
            return takeWaiters(&state)
        }
        for continuation in wake { continuation.resume() }
    }

    private func takeWaiters(_ state: inout State) -> [CheckedContinuation<Void, Never>] {
        var wake: [CheckedContinuation<Void, Never>] = []
        if !state.acknowledged.isEmpty, let recorder = state.recorder {
            wake.append(recorder)
            state.recorder = nil
        }
        if let sender = state.sender, state.senderMayGo(below: sender.below) {
            wake.append(sender.continuation)
            state.sender = nil
        }
        return wake
    }
}
