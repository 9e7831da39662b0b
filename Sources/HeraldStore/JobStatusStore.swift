import HeraldCore
import HeraldRedis
import HeraldRuntime

/// What became of a push job, as its producer reads it (`GET /v1/apps/{app}/jobs/{jobId}`).
public struct JobStatus: Sendable, Equatable {
    public enum State: String, Sendable { case queued, sending, done }

    /// Pushes settled so far, each counted once however often a crash made it go out.
    public struct Counts: Sendable, Equatable {
        public var delivered = 0
        public var tokensRemoved = 0
        /// Attempts after the first, over the settled pushes.
        public var retried = 0
        public var deadLettered = 0
        /// iOS 18 broadcasts of the job (one per channel of a post, or a broadcast job's one) APNs accepted, and
        /// those dead-lettered; each reaches every device on its channel.
        public var broadcasts = 0
        public var broadcastsDeadLettered = 0

        public init() {}

        public static func + (a: Counts, b: Counts) -> Counts {
            var sum = a
            sum.delivered += b.delivered
            sum.tokensRemoved += b.tokensRemoved
            sum.retried += b.retried
            sum.deadLettered += b.deadLettered
            sum.broadcasts += b.broadcasts
            sum.broadcastsDeadLettered += b.broadcastsDeadLettered
            return sum
        }
    }

    public var jobID: String
    /// The job's `target` as in its record (schemas/push-job.schema.json).
    public var target: JSONValue?
    public var acceptedAt: String?
    public var startedAt: String?
    public var finishedAt: String?
    public var counts = Counts()
    /// The whole job went to the dead-letter topic (Redis kept refusing its data).
    public var jobDeadLettered = false

    public var state: State { finishedAt != nil ? .done : startedAt != nil ? .sending : .queued }

    public var jsonValue: JSONValue {
        var fields: [String: JSONValue] = [
            "jobId": .string(jobID), "state": .string(state.rawValue),
            "counts": .object(["delivered": .number(Double(counts.delivered)),
                               "tokensRemoved": .number(Double(counts.tokensRemoved)),
                               "retried": .number(Double(counts.retried)),
                               "deadLettered": .number(Double(counts.deadLettered)),
                               "broadcasts": .number(Double(counts.broadcasts)),
                               "broadcastsDeadLettered": .number(Double(counts.broadcastsDeadLettered))]),
        ]
        fields["target"] = target
        fields["acceptedAt"] = acceptedAt.map { .string($0) }
        fields["startedAt"] = startedAt.map { .string($0) }
        fields["finishedAt"] = finishedAt.map { .string($0) }
        if jobDeadLettered { fields["jobDeadLettered"] = .bool(true) }
        return .object(fields)
    }
}

/// How one push of a job settled, as its job status counts it.
public struct SettledPush: Sendable, Equatable {
    public enum Outcome: String, Sendable, CaseIterable { case delivered = "d", tokenRemoved = "r", deadLettered = "x" }
    public var token: String
    public var outcome: Outcome
    /// Attempts after the first.
    public var retries: Int

    public init(token: String, outcome: Outcome, retries: Int) {
        self.token = token
        self.outcome = outcome
        self.retries = retries
    }
}

/// Job statuses in Redis: `herald:{app}:job:<jobId>`, a hash kept `ttl` after its last write. Ingest writes
/// `acceptedAt` and `target` when the broker acknowledges the job; the dispatcher writes `startedAt`, the counts and
/// `finishedAt` (with `f:<progress key>` for each record that finished it). The state is derived from
/// which times are present, so the two services never race over it.
///
/// The dispatcher counts a settled push in the same script that marks it settled in the job's fan-out progress
/// record (`s:<token>` there, in the app's slot too): a push marked before a crash is skipped on resume, one not
/// marked is sent again and counted then, so no push is counted twice. A job too small to keep a progress record
/// writes its counts once, with `finishedAt`, and a second run of it after that writes nothing.
///
/// Each run of a fan-out names itself `owner` in the status when it starts; the writes of a run whose partition
/// was taken over (a revoked owner's late ones) then change nothing: its pushes the new owner did not see marked
/// it sends and counts itself, and a late mark could land after the new owner's cursor had forgotten that push.
public struct JobStatusStore: Sendable {
    let redis: RedisClient
    public let ttl: Duration

    public init(redis: RedisClient, ttl: Duration = .seconds(86_400)) {
        self.redis = redis
        self.ttl = ttl
    }

    /// The fields a job's status starts with; the dispatcher sets them too (only where unset), so a status whose
    /// ingest write failed still says what it was.
    public struct Origin: Sendable {
        public var jobID: String
        public var acceptedAt: String
        public var target: String

        public init(_ job: PushJob) {
            jobID = job.id
            acceptedAt = job.createdAt
            target = String(decoding: job.target.jsonValue.encoded(), as: UTF8.self)
        }
    }

    public func accepted(_ job: PushJob) async throws {
        let origin = Origin(job)
        let key = RedisKeys(app: job.appId).jobStatus(job.id)
        let replies = try await redis.pipeline([
            ["HSET", key, "jobId", origin.jobID, "acceptedAt", origin.acceptedAt, "target", origin.target],
            ["EXPIRE", key, seconds(ttl)],
        ])
        for case .error(let message) in replies { throw RedisError(.server, message) }
    }

    /// Nil for a job this app never published or whose status has expired.
    public func read(app: String, jobID: String) async throws -> JobStatus? {
        guard let fields = try await redis.command(["HGETALL", RedisKeys(app: app).jobStatus(jobID)]).fieldValues,
              !fields.isEmpty else { return nil }
        var status = JobStatus(jobID: jobID)
        status.target = fields["target"].flatMap { JSONValue(parsing: Array($0.utf8)) }
        status.acceptedAt = fields["acceptedAt"]
        status.startedAt = fields["startedAt"]
        status.finishedAt = fields["finishedAt"]
        status.counts.delivered = fields["delivered"].flatMap { Int($0) } ?? 0
        status.counts.tokensRemoved = fields["tokensRemoved"].flatMap { Int($0) } ?? 0
        status.counts.retried = fields["retried"].flatMap { Int($0) } ?? 0
        status.counts.deadLettered = fields["deadLettered"].flatMap { Int($0) } ?? 0
        status.counts.broadcasts = fields["broadcasts"].flatMap { Int($0) } ?? 0
        status.counts.broadcastsDeadLettered = fields["broadcastsDeadLettered"].flatMap { Int($0) } ?? 0
        status.jobDeadLettered = fields["jobDeadLettered"] == "1"
        return status
    }

    /// Marks the job started by `owner` (this run: later writes name it) and returns the fields of its progress
    /// record (`progressKey`, in the app's slot), in one round trip; only `done` when this record finished the job
    /// (run again after a rebalance, before its offset was committed: a small job keeps no progress record, and its
    /// pushes must not go twice). Another record of the same job id (produced again after a fix) runs.
    public func started(app: String, origin: Origin, startedAt: String, progressKey: String,
                        owner: String) async throws -> [String: String] {
        let reply = try await redis.run(Self.start, keys: [RedisKeys(app: app).jobStatus(origin.jobID), progressKey],
                                        args: [seconds(ttl), origin.jobID, origin.acceptedAt, startedAt, origin.target, owner])
        return reply.fieldValues ?? [:]
    }

    /// Moves a fan-out's settled cursor, forgetting the settled pushes it now covers; nothing when another run
    /// than `owner` has started the job since.
    public func advanced(app: String, jobID: String, progressKey: String, progressTTL: Duration, owner: String,
                         cursor: String, covering tokens: [String]) async throws {
        _ = try await redis.run(Self.advance, keys: [RedisKeys(app: app).jobStatus(jobID), progressKey],
                                args: [owner, cursor, seconds(progressTTL)] + tokens.map { "s:" + $0 })
    }

    /// Marks a broadcast to `channelID` settled in a fan-out's progress record, so a run of the same record again
    /// does not publish it twice (one broadcast reaches every device on the channel), and counts it in the job's
    /// status, once: `delivered` (APNs accepted it) or dead-lettered; `exhausted`: dead-lettered after every attempt
    /// (a final update keeps such a channel for the replay). Nothing when another run than `owner` started the job.
    public func broadcastSettled(app: String, jobID: String, progressKey: String, channelID: String, delivered: Bool,
                                 exhausted: Bool, progressTTL: Duration, owner: String) async throws {
        _ = try await redis.run(Self.markBroadcast, keys: [RedisKeys(app: app).jobStatus(jobID), progressKey],
                                args: ["b:" + channelID, seconds(progressTTL), exhausted ? "x" : "1",
                                       delivered ? "broadcasts" : "broadcastsDeadLettered", seconds(ttl), owner])
    }

    /// What a `settled` call ends the job with.
    public struct Finish: Sendable {
        public var origin: Origin
        public var startedAt: String
        public var finishedAt: String
        public var jobDeadLettered = false

        public init(origin: Origin, startedAt: String, finishedAt: String, jobDeadLettered: Bool = false) {
            self.origin = origin
            self.startedAt = startedAt
            self.finishedAt = finishedAt
            self.jobDeadLettered = jobDeadLettered
        }
    }

    /// Counts `pushes` not yet marked in the progress record (marking them there, kept `progressTTL`; nil keeps no
    /// marks) plus `tally`, counted elsewhere; with `finish`, ends the job — unless it has ended already, in which
    /// case nothing is written — and replaces its progress record with a `done` mark kept an hour (without marks,
    /// keeps what the record holds, a post's broadcast marks, an hour).
    /// `owner`: the run that writes, as it named itself in `started` ("" for a job that did not).
    public func settled(app: String, jobID: String, progressKey: String, progressTTL: Duration?, pushes: [SettledPush],
                        tally: JobStatus.Counts = .init(), finish: Finish? = nil, owner: String = "") async throws {
        var args = [seconds(ttl), progressTTL.map(seconds) ?? "0", finish?.finishedAt ?? "",
                    finish?.jobDeadLettered == true ? "1" : "", finish?.origin.jobID ?? "",
                    finish?.origin.acceptedAt ?? "", finish?.startedAt ?? "", finish?.origin.target ?? "",
                    String(tally.delivered), String(tally.tokensRemoved), String(tally.retried),
                    String(tally.deadLettered), owner, String(tally.broadcasts), String(tally.broadcastsDeadLettered)]
        // Pushes sent once are marked a group per outcome, each group one variadic HSET (whose reply counts the
        // marks that are new); a retried push, rare, by itself, so that only a new mark adds its retries.
        let groups = SettledPush.Outcome.allCases.map { outcome in
            pushes.filter { $0.outcome == outcome && $0.retries == 0 }
        }
        let retried = pushes.filter { $0.retries > 0 }
        args.reserveCapacity(args.count + 3 + 2 * pushes.count + retried.count)
        args += groups.map { String($0.count) }
        for group in groups { for push in group { args += ["s:" + push.token, push.outcome.rawValue] } }
        for push in retried { args += ["s:" + push.token, push.outcome.rawValue, String(push.retries)] }
        _ = try await redis.run(Self.settle, keys: [RedisKeys(app: app).jobStatus(jobID), progressKey], args: args)
    }

    private func seconds(_ duration: Duration) -> String { String(max(1, duration.components.seconds)) }

    /// KEYS: status, progress. ARGV: status TTL, jobId, acceptedAt, startedAt, target, owner. Returns the progress
    /// hash, or {done, 1} without writing anything when the record of this progress key has finished the job (each
    /// record that finishes it is named in the status, so a record that runs again never sends again). A job that
    /// another record finished (the job produced again) is started afresh: its counts and end become this run's,
    /// and its writes would otherwise be refused as writes to an ended job.
    static let start = RedisScript(source: """
        local status = KEYS[1]
        if redis.call('HEXISTS', status, 'f:' .. KEYS[2]) == 1 then return {'done', '1'} end
        if redis.call('HEXISTS', status, 'finishedAt') == 1 then
          redis.call('HDEL', status, 'finishedAt', 'jobDeadLettered', 'startedAt', 'delivered', 'tokensRemoved',
                     'retried', 'deadLettered', 'broadcasts', 'broadcastsDeadLettered')
        end
        redis.call('HSET', status, 'owner', ARGV[6])
        redis.call('HSETNX', status, 'jobId', ARGV[2])
        redis.call('HSETNX', status, 'acceptedAt', ARGV[3])
        redis.call('HSETNX', status, 'startedAt', ARGV[4])
        redis.call('HSETNX', status, 'target', ARGV[5])
        redis.call('EXPIRE', status, ARGV[1])
        return redis.call('HGETALL', KEYS[2])
        """)

    /// KEYS: status, progress. ARGV: status TTL, progress TTL ("0": no marks), finishedAt ("" unless ending),
    /// jobDeadLettered ("1"), jobId, acceptedAt, startedAt, target (set where unset, when ending), the tally's
    /// delivered, tokensRemoved, retried, deadLettered, the writing run ("" for none), the tally's broadcasts and
    /// broadcastsDeadLettered; how many pushes sent once
    /// settled delivered, with their token removed and dead-lettered, then those pushes as (`s:<token>`, outcome)
    /// pairs in that order, then (`s:<token>`, outcome, retries) per retried push.
    /// Returns 0 when the job had ended already or another run has started it since (nothing written: a late write
    /// of a revoked owner must not count its pushes again), else 1.
    ///
    /// One `HSET` marks up to 1,000 pushes (Lua's stack takes a few thousand values): a call per push made this
    /// script cost Redis 1.8 µs per push of a fan-out, against 1.1.
    static let settle = RedisScript(source: """
        local status, progress = KEYS[1], KEYS[2]
        local finishedAt = ARGV[3]
        if redis.call('HEXISTS', status, 'finishedAt') == 1 then return 0 end
        \(returnUnlessOwner(argument: 13))
        local counts = {d = tonumber(ARGV[9]), r = tonumber(ARGV[10]), x = tonumber(ARGV[12])}
        local retried = tonumber(ARGV[11])
        local marking = ARGV[2] ~= '0'
        local i = 19
        for group = 16, 18 do
          local last = i + 2 * tonumber(ARGV[group]) - 1
          if last >= i then
            local outcome = ARGV[i + 1]
            if marking then
              for first = i, last, 2000 do
                counts[outcome] = counts[outcome] + redis.call('HSET', progress, unpack(ARGV, first, math.min(last, first + 1999)))
              end
            else
              counts[outcome] = counts[outcome] + (last - i + 1) / 2
            end
          end
          i = last + 1
        end
        for j = i, #ARGV, 3 do
          if not marking or redis.call('HSETNX', progress, ARGV[j], ARGV[j + 1]) == 1 then
            counts[ARGV[j + 1]] = counts[ARGV[j + 1]] + 1
            retried = retried + tonumber(ARGV[j + 2])
          end
        end
        if marking and #ARGV >= 19 then redis.call('EXPIRE', progress, ARGV[2]) end
        if counts.d > 0 then redis.call('HINCRBY', status, 'delivered', counts.d) end
        if counts.r > 0 then redis.call('HINCRBY', status, 'tokensRemoved', counts.r) end
        if counts.x > 0 then redis.call('HINCRBY', status, 'deadLettered', counts.x) end
        if retried > 0 then redis.call('HINCRBY', status, 'retried', retried) end
        if ARGV[14] ~= '0' then redis.call('HINCRBY', status, 'broadcasts', ARGV[14]) end
        if ARGV[15] ~= '0' then redis.call('HINCRBY', status, 'broadcastsDeadLettered', ARGV[15]) end
        if finishedAt ~= '' then
          redis.call('HSETNX', status, 'jobId', ARGV[5])
          redis.call('HSETNX', status, 'acceptedAt', ARGV[6])
          redis.call('HSETNX', status, 'startedAt', ARGV[7])
          redis.call('HSETNX', status, 'target', ARGV[8])
          redis.call('HSET', status, 'finishedAt', finishedAt, 'f:' .. progress, '1')
          if ARGV[4] == '1' then redis.call('HSET', status, 'jobDeadLettered', '1') end
          if marking then
            redis.call('DEL', progress)
            redis.call('HSET', progress, 'done', '1')
            redis.call('EXPIRE', progress, 3600)
          else
            -- A job without marks may still have its broadcasts' (`b:`): kept the same hour, not the whole TTL.
            redis.call('EXPIRE', progress, 3600)
          end
        end
        redis.call('EXPIRE', status, ARGV[1])
        return 1
        """)

    /// KEYS: status, progress. ARGV: the broadcast's mark (`b:<channelId>`), the progress TTL, its value (`x`:
    /// exhausted), the status field that counts it, the status TTL, the writing run. A mark that was there already
    /// counts nothing, nor does one for a job that has ended.
    static let markBroadcast = RedisScript(source: """
        local status = KEYS[1]
        if redis.call('HEXISTS', status, 'finishedAt') == 1 then return 0 end
        \(returnUnlessOwner(argument: 6))
        if redis.call('HSET', KEYS[2], ARGV[1], ARGV[3]) == 1 then
          redis.call('HINCRBY', status, ARGV[4], 1)
          redis.call('EXPIRE', status, ARGV[5])
        end
        redis.call('EXPIRE', KEYS[2], ARGV[2])
        return 1
        """)

    /// KEYS: status, progress. ARGV: owner, cursor, progress TTL, then the `s:<token>` marks the cursor covers.
    static let advance = RedisScript(source: """
        local status, progress = KEYS[1], KEYS[2]
        \(returnUnlessOwner(argument: 1))
        redis.call('HSET', progress, 'cursor', ARGV[2])
        for first = 4, #ARGV, 2000 do redis.call('HDEL', progress, unpack(ARGV, first, math.min(#ARGV, first + 1999))) end
        redis.call('EXPIRE', progress, ARGV[3])
        return 1
        """)

    /// Lua: returns 0 when the status (`status`) names another run as its owner than ARGV[argument] (a write of no
    /// run, "", is not checked).
    private static func returnUnlessOwner(argument: Int) -> String {
        """
        local owner = redis.call('HGET', status, 'owner')
        if owner and ARGV[\(argument)] ~= '' and owner ~= ARGV[\(argument)] then return 0 end
        """
    }
}
