import Foundation
import HeraldCore
import HeraldCrypto
import HeraldRuntime
import HeraldStore

/// Where a fan-out has got to, kept in Redis so that a dispatcher that restarts (or takes over the partition)
/// resumes there instead of from the first subscriber, and skips the pushes it already settled.
///
/// Key: `herald:{<app>}:fanout:<group>:<topic>:<partition>:<offset>:<jobId>`, a hash per job record (a re-delivered
/// record finds its own), in the app's slot with the job's status: `cursor` — the scan cursor up to which every push
/// is settled, as `<cursor>@<server>` when the Redis process that gave it is known; `s:<token>` — a push settled
/// past that cursor (marked by the same script that counts it in the job's status), or before it while its mark was
/// not written for sure when the cursor was saved; `b:<channelId>` — a
/// post's broadcast to that channel settled, `x` when dead-lettered after every attempt
/// (one request reaches every device on it, so a run again skips it even where the fan-out keeps no other mark);
/// `done` — the whole fan-out settled (kept an hour, for a record that runs again before its offset was committed).
/// It expires after `ttl` otherwise.
struct FanOutProgress: Sendable {
    let statuses: JobStatusStore
    let group: String
    let ttl: Duration

    struct Saved: Sendable {
        var done = false
        var cursor = "0"
        /// The Redis process `cursor` is good on (`Scripts.scanPage`); nil when not known.
        var server: String?
        /// Tokens settled past `cursor`.
        var settled: Set<String> = []
        /// Channels whose broadcast is settled.
        var broadcasts: Set<String> = []
        /// Those of them whose broadcast was dead-lettered after every attempt.
        var exhaustedBroadcasts: Set<String> = []
    }

    /// A cursor and its server as the record keeps them, and back.
    static func position(cursor: String, server: String?) -> String { server.map { cursor + "@" + $0 } ?? cursor }

    static func position(_ stored: String) -> (cursor: String, server: String?) {
        guard let at = stored.firstIndex(of: "@") else { return (stored, nil) }
        return (String(stored[..<at]), String(stored[stored.index(after: at)...]))
    }

    func key(app: String, _ source: DeadLetter.Source, job: String) -> String {
        RedisKeys(app: app).fanOut(group: group, topic: source.topic, partition: source.partition,
                                   offset: source.offset, job: job)
    }
}

/// One job's settled pushes, on their way into its status and, for a fan-out that keeps a progress record, into
/// that record.
///
/// A job that keeps no record (one push, or one batch send's worth) tallies in memory and writes once, when it
/// ends. A recording one writes as it goes, in few writes: pushes settled while a write is under way go in the next
/// one. `record` returns once its pushes are written (or the write failed: they go again with the next write), and
/// the caller holds the pushes' slots until then, so the pushes a crash can send twice are never more than those
/// in flight.
final class SettledPushes: Sendable {
    private struct State {
        var recording = false
        var tally = JobStatus.Counts()
        var pending: [SettledPush] = []
        var waiting: [CheckedContinuation<Void, Never>] = []
        var writing = false
        /// The tokens of the write under way.
        var beingWritten: [String] = []
        /// Tokens whose marks a saved cursor kept (not written for sure then): the next save drops those written
        /// since.
        var keptMarks: Set<String> = []
    }

    let app: String
    let source: DeadLetter.Source
    private let origin: JobStatusStore.Origin
    private let startedAt = Timestamp.rfc3339(Date())
    /// Names this run in the job's status: once another run has started the job (the partition was taken over),
    /// this one's writes change nothing.
    private let owner = SecureRandom.hex(8)
    private let progress: FanOutProgress
    private let progressKey: String
    private let logger: Logger
    private let state = Lock(State())

    init(job: PushJob, source: DeadLetter.Source, progress: FanOutProgress, logger: Logger) {
        self.app = job.appId
        self.source = source
        self.origin = JobStatusStore.Origin(job)
        self.progress = progress
        self.progressKey = progress.key(app: job.appId, source, job: job.id)
        self.logger = logger
    }

    /// Marks the job started and reads its progress record.
    func start() async throws -> FanOutProgress.Saved {
        let fields = try await progress.statuses.started(app: app, origin: origin, startedAt: startedAt,
                                                         progressKey: progressKey, owner: owner)
        var saved = FanOutProgress.Saved()
        for (field, value) in fields {
            if field == "done" { saved.done = true }
            else if field == "cursor" { (saved.cursor, saved.server) = FanOutProgress.position(value) }
            else if field.hasPrefix("s:") { saved.settled.insert(String(field.dropFirst(2))) }
            else if field.hasPrefix("b:") {
                saved.broadcasts.insert(String(field.dropFirst(2)))
                if value == "x" { saved.exhaustedBroadcasts.insert(String(field.dropFirst(2))) }
            }
        }
        return saved
    }

    /// Marks the broadcast to `channelID` settled and counts it in the job's status: `delivered`, or dead-lettered
    /// (`exhausted`: after every attempt).
    func broadcastSettled(_ channelID: String, delivered: Bool, exhausted: Bool) async throws {
        try await progress.statuses.broadcastSettled(app: app, jobID: origin.jobID, progressKey: progressKey,
                                                     channelID: channelID, delivered: delivered, exhausted: exhausted,
                                                     progressTTL: progress.ttl, owner: owner)
    }

    /// A broadcast job's one broadcast, counted with the job's end (it keeps no progress record).
    func tallyBroadcast(delivered: Bool) {
        state.withLock { s in
            if delivered { s.tally.broadcasts += 1 } else { s.tally.broadcastsDeadLettered += 1 }
        }
    }

    /// From now on every settled push is marked in the progress record as it settles.
    func startRecording() { state.withLock { $0.recording = true } }

    /// Saves the scan cursor and drops the marks of the pushes it covers. A push whose mark is not written for sure
    /// keeps it until a later save: a write whose answer was lost may have counted it, and only the mark tells its
    /// next write so.
    func advance(cursor: String, server: String?, covering tokens: [String]) async throws {
        let (covered, writtenSince) = state.withLock { s -> ([String], Set<String>) in
            let unsure = Set(s.pending.map(\.token) + s.beingWritten)
            let writtenSince = s.keptMarks.subtracting(unsure)
            s.keptMarks.subtract(writtenSince)
            var covered = Array(writtenSince)
            for token in tokens {
                if unsure.contains(token) { s.keptMarks.insert(token) } else { covered.append(token) }
            }
            return (covered, writtenSince)
        }
        do {
            try await progress.statuses.advanced(app: app, jobID: origin.jobID, progressKey: progressKey,
                                                 progressTTL: progress.ttl, owner: owner,
                                                 cursor: FanOutProgress.position(cursor: cursor, server: server),
                                                 covering: covered)
        } catch {
            state.withLock { $0.keptMarks.formUnion(writtenSince) }
            throw error
        }
    }

    func record(_ pushes: [SettledPush]) async {
        guard !pushes.isEmpty else { return }
        // Not cancellable: a revoked job's settled pushes are recorded all the same, for a next run that starts
        // after they land (one that started before does not count them: it sends them again itself).
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let next = state.withLock { s -> RecordStep in
                guard s.recording else {
                    for push in pushes { s.tally = s.tally + Self.count(push) }
                    return .tallied
                }
                s.pending += pushes
                s.waiting.append(continuation)
                guard !s.writing else { return .queued }
                s.writing = true
                return .write
            }
            switch next {
            case .tallied: continuation.resume()
            case .queued: break
            case .write: Task { await self.writeAll() }
            }
        }
    }

    private enum RecordStep { case tallied, queued, write }

    /// Ends the job's status (with whatever is not written yet) and, for a recording fan-out, leaves its `done`
    /// mark. A job that has ended already (run again before its offset was committed) changes nothing.
    func finish(jobDeadLettered: Bool = false) async throws {
        let (recording, pending, tally) = state.withLock { s in (s.recording, s.pending, s.tally) }
        try await progress.statuses.settled(
            app: app, jobID: origin.jobID, progressKey: progressKey, progressTTL: recording ? progress.ttl : nil,
            pushes: pending, tally: tally,
            finish: .init(origin: origin, startedAt: startedAt, finishedAt: Timestamp.rfc3339(Date()),
                          jobDeadLettered: jobDeadLettered), owner: owner)
    }

    /// Settled pushes kept to be marked in the progress record while writes fail.
    static let maximumPending = 1000

    /// Settled pushes not written yet.
    var pendingCount: Int { state.withLock { $0.pending.count } }

    private static func count(_ push: SettledPush) -> JobStatus.Counts {
        var counts = JobStatus.Counts()
        switch push.outcome {
        case .delivered: counts.delivered = 1
        case .tokenRemoved: counts.tokensRemoved = 1
        case .deadLettered: counts.deadLettered = 1
        }
        counts.retried = push.retries
        return counts
    }

    private func writeAll() async {
        while true {
            let (pushes, waiting) = state.withLock { s -> ([SettledPush], [CheckedContinuation<Void, Never>]) in
                guard !s.waiting.isEmpty else {
                    s.writing = false
                    return ([], [])
                }
                defer { s.pending = []; s.waiting = [] }
                s.beingWritten = s.pending.map(\.token)
                return (s.pending, s.waiting)
            }
            guard !waiting.isEmpty else { return }
            do {
                try await progress.statuses.settled(app: app, jobID: origin.jobID, progressKey: progressKey,
                                                    progressTTL: progress.ttl, pushes: pushes, owner: owner)
                state.withLock { $0.beingWritten = [] }
            } catch {
                // Kept for the next write, or the job's end: until then a restart would send them again. While Redis
                // refuses writes and serves reads the fan-out goes on, so past `maximumPending` the oldest are kept
                // as counts only (a restart sends those again too): memory and each write's size stay bounded.
                state.withLock { s in
                    s.beingWritten = []
                    s.pending = pushes + s.pending
                    let overflow = s.pending.count - Self.maximumPending
                    guard overflow > 0 else { return }
                    for push in s.pending.prefix(overflow) { s.tally = s.tally + Self.count(push) }
                    s.pending.removeFirst(overflow)
                }
                logger.warning("cannot record settled pushes; a restart would send them again",
                               ["error": "\(error)", "pushes": "\(pushes.count)"])
            }
            for continuation in waiting { continuation.resume() }
        }
    }
}
