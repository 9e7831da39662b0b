// Over 400 lines: one job record run to its end (checks, the fan-out with its read-ahead and saved progress, the final clean-up, the status) is one flow sharing the retry rules at the bottom.
import Foundation
import HeraldCore
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldStore

/// Runs one job record to the end: validates it (dead-lettering an invalid one), resolves its targets in
/// batches, delivers every push and, for a post's final update, removes the post's registrations. A job whose
/// targets Redis keeps refusing to read (`StoreRefusal`) is dead-lettered whole.
struct JobRunner: Sendable {
    let apps: AppRegistry
    let subscriptions: SubscriptionStore
    let activities: ActivityStore
    let deliverer: Deliverer
    let broadcaster: Broadcaster
    let deadLetters: DeadLetterWriter
    let progress: FanOutProgress
    let limit: ConcurrencyLimit
    let batchSize: Int
    let maxJobBytes: Int
    let signing: JobSigning
    let maxBatchesInFlight: Int
    /// One permit per fan-out batch read and not settled, across all jobs (a job's first batch, read before it is
    /// known to be a fan-out, takes none): bounds the pushes held in memory however many fan-outs run.
    let batchPermits: ConcurrencyLimit
    let retryDelay: Duration
    let metrics: DispatcherMetrics
    let logger: Logger

    /// True when every push of the job is settled (the offset may be committed); false when cancelled first.
    func run(_ record: KafkaRecord) async -> Bool {
        metrics.jobsConsumed.increment()
        let source = DeadLetter.Source(topic: record.topic, partition: record.partition, offset: record.offset)
        let timestamp = Int64(Date().timeIntervalSince1970)
        let plan: JobPlan
        var parsed: PushJob?
        let keyApp = record.key.map { String(decoding: $0.prefix { $0 != UInt8(ascii: "/") }, as: UTF8.self) } ?? ""
        do throws(ValidationError) {
            // Before any parsing: a huge record costs nothing but its dead letter.
            guard record.value.count <= maxJobBytes else {
                throw ValidationError(code: "job_too_large",
                                      message: "the record is \(record.value.count) bytes, over the limit of \(maxJobBytes) (HERALD_MAX_JOB_BYTES)")
            }
            guard signatureAccepted(record, keyApp: keyApp) else {
                metrics.jobsInvalid.increment()
                logger.warning("job record without a valid signature; dead-lettered, nothing sent",
                               ["record.app": keyApp, "partition": "\(record.partition)", "offset": "\(record.offset)"])
                return await deadLetters.write(DeadLetter(unsignedJob: record.value, keyApp: keyApp, source: source))
            }
            let job = try PushJob.decode(record.value)
            parsed = job
            try job.validate()
            guard job.appId == keyApp else {
                throw ValidationError.invalid("appId", "appId \(job.appId) is not the record key's app (\(keyApp))")
            }
            guard let app = apps.directory.apps[job.appId] else {
                throw ValidationError(code: "unknown_app", message: "app \(job.appId) is not in the apps file",
                                      field: "appId")
            }
            do { plan = try JobPlan(job: job, app: app, timestamp: timestamp) } catch { throw error.error }
        } catch {
            metrics.jobsInvalid.increment()
            guard await deadLetters.write(DeadLetter(invalidJob: record.value, source: source, job: parsed, error: error)) else {
                return false
            }
            // Only for the app the record is keyed (and signed) for, and an id fit for a key.
            if let parsed, parsed.appId == keyApp, PushJob.isValidID(parsed.id) {
                await endRefusedJobStatus(parsed, source: source)
            }
            return true
        }
        let context = JobContext(plan: plan, source: source,
                                 settled: SettledPushes(job: plan.job, source: source, progress: progress, logger: logger))
        let settled: Bool
        switch plan.job.target {
        case .device:
            guard let push = plan.devicePush(timestamp: timestamp) else { return true }
            do { try await limit.acquire() } catch { return false }
            settled = await deliverer.deliver(push, context: context)
        case .channel(let channel):
            var ran = false // false when the record had finished the job already: its run removed the channel
            // The channel index holds the targets themselves: a scan is the whole read, nothing to load after it.
            do throws(StoreRefusal) { settled = try await fanOut(context, beforeSending: { _ in
                ran = true
                return true
            }) { cursor in
                let batch = try await subscriptions.channelBatch(app: plan.app.id, channel: channel, cursor: cursor,
                                                                 count: batchSize)
                return ScanPage(cursor: batch.cursor, items: batch.targets, server: batch.server)
            } load: { targets in
                targets.compactMap(plan.push(for:))
            } } catch { return await deadLetterWhole(context, error) }
            if settled, plan.job.final == true, ran {
                guard await removeChannel(app: plan.app.id, channel: channel) else { return false }
            }
        case .broadcast(let target):
            settled = await broadcaster.publishReplay(context, to: target)
        case .post(let post) where plan.job.broadcastChannel != nil:
            settled = await broadcaster.createChannel(plan, post: post, plan.job.broadcastChannel!)
        case .post(let post):
            // The broadcast first: one request reaches every iOS 18 device that joined a channel of the post.
            var exhausted: Set<String> = [] // channels whose broadcast failed every attempt, this run or an earlier one
            var ran = false // false when the record had finished the job already: its run dealt with the channels
            do throws(StoreRefusal) { settled = try await fanOut(context, beforeSending: { saved in
                ran = true
                let published = await broadcaster.publish(context, post: post, settled: saved.broadcasts)
                exhausted = published.exhausted.union(saved.exhaustedBroadcasts)
                return published.settled
            }) { cursor in
                let batch = try await activities.postIDs(app: plan.app.id, postIDHash: post, cursor: cursor,
                                                         count: batchSize)
                return ScanPage(cursor: batch.cursor, items: batch.ids, server: batch.server)
            } load: { ids in
                try await activities.pushTargets(app: plan.app.id, postIDHash: post, ids: ids).compactMap(plan.push(for:))
            } } catch { return await deadLetterWhole(context, error) }
            if settled, plan.job.isFinal, ran {
                guard await removePost(app: plan.app.id, post: post),
                      await broadcaster.deleteChannels(plan, post: post, keeping: exhausted) else { return false }
            }
        }
        guard settled, await finish(context) else { return false }
        metrics.jobsCompleted.increment()
        return true
    }

    /// Ends the job's status (and leaves a fan-out's `done` mark); false only when cancelled first. Redis refusing
    /// the write for good is logged and ends the job all the same: its status then stays `sending`.
    private func finish(_ context: JobContext, jobDeadLettered: Bool = false) async -> Bool {
        do {
            try await retrying("record the job finished") { try await context.settled.finish(jobDeadLettered: jobDeadLettered) }
            return true
        } catch let refusal as StoreRefusal {
            logger.error("Redis refuses the job's status; it stays unfinished",
                         ["job.id": context.plan.job.id, "error": refusal.error.message])
            return true
        } catch {
            return false
        }
    }

    /// True when signatures are off, or the record carries a signature by the deployment's secret or one of the
    /// record key's app's secrets (so an app's producer can write only that app's jobs).
    private func signatureAccepted(_ record: KafkaRecord, keyApp: String) -> Bool {
        guard case .signed(let deployment) = signing else { return true }
        let appSecrets = apps.directory.apps[keyApp]?.jobSigningSecrets ?? []
        return JobSignature.verifies(record.headers, record: record.value, secrets: [deployment] + appSecrets)
    }

    /// A job dead-lettered before it ran (invalid, an app this dispatcher does not know yet): ingest left its status
    /// `queued`, which would say so until it expires; it ends dead-lettered. One try: the letter is what counts.
    private func endRefusedJobStatus(_ job: PushJob, source: DeadLetter.Source) async {
        let now = Timestamp.rfc3339(Date())
        do {
            try await progress.statuses.settled(app: job.appId, jobID: job.id, progressKey: progress.key(app: job.appId, source, job: job.id),
                                                progressTTL: nil, pushes: [],
                                                finish: .init(origin: .init(job), startedAt: now, finishedAt: now,
                                                              jobDeadLettered: true))
        } catch {
            logger.warning("cannot end a refused job's status; it says queued until it expires",
                           ["job.id": job.id, "app": job.appId, "error": "\(error)"])
        }
    }

    private func deadLetterWhole(_ context: JobContext, _ refusal: StoreRefusal) async -> Bool {
        let job = context.plan.job
        logger.error("Redis keeps refusing this job's data; dead-lettering the whole job",
                     ["job.id": job.id, "app": job.appId, "error": refusal.error.message])
        guard await deadLetters.write(DeadLetter(storeRefused: job, source: context.source, refusal: refusal)) else {
            return false
        }
        // Redis refusing the job's data may well refuse its status too: one try.
        try? await context.settled.finish(jobDeadLettered: true)
        return true
    }

    /// Streams the targets batch by batch (bounded memory whatever their number), keeps up to
    /// `maxBatchesInFlight` batches sending at once, and records in Redis the cursor up to which every push is
    /// settled and, past it, each push settled (`SettledPushes`), so a resumed fan-out skips them.
    ///
    /// Reading runs ahead of sending: the next `readAhead` batches are scanned and loaded from Redis while the
    /// ones before them are sending, each batch's load (a post's HGETALL round) beside the next scan, and the
    /// cursor is saved in a child task. A batch read but not launched sends nothing, and launching stops
    /// `maxBatchesInFlight + 1` batches past the last saved cursor, which bounds the record's size.
    /// `scan` reads a batch of items (a channel's targets, a post's registration ids) and `load` turns them into
    /// pushes; `beforeSending` runs once the saved progress is read and the fan-out is not done (a post's broadcasts),
    /// before any push is sent. True once every push is settled, false when cancelled first (or `beforeSending` was);
    /// throws when Redis keeps refusing.
    private func fanOut<Item: Sendable>(
        _ context: JobContext, beforeSending: (FanOutProgress.Saved) async -> Bool = { _ in true },
        scan: @escaping @Sendable (String) async throws -> ScanPage<Item>,
        load: @escaping @Sendable ([Item]) async throws -> [Push]
    ) async throws(StoreRefusal) -> Bool {
        // The first batch is read while the saved progress is looked up: nearly every fan-out has none (one
        // Redis round trip saved on the latency of every small job); a resumed one may discard that batch.
        async let fromStart = try? Self.read(from: "0", scan: scan, load: load)
        let saved: FanOutProgress.Saved
        do { saved = try await retrying("load fan-out progress") { try await context.settled.start() } }
        catch let refusal as StoreRefusal { throw refusal } catch { return false }
        if saved.done {
            logger.info("fan-out already settled; nothing sent again", ["job.id": context.plan.job.id])
            return true
        }
        guard await beforeSending(saved) else { return false }
        let start = saved.cursor
        let first = start == "0" ? await fromStart : nil
        // Where the next scan starts: a cursor, and the Redis process it is good on (nil: not known).
        var next: (cursor: String, server: String?) = (start, saved.server)
        let resumed = start != "0" || !saved.settled.isEmpty
        if resumed {
            metrics.resumedFanOuts.increment()
            logger.info("resuming a fan-out from its saved progress", [
                "job.id": context.plan.job.id, "cursor": start, "pushes.settled": "\(saved.settled.count)"])
        }
        // One send's worth of pushes in all (nearly every job): not worth a record; a crash sends them again.
        if !resumed, let first, first.cursor == "0", first.pushes.count <= Self.pushesPerSend {
            return await send(first.pushes, context: context)
        }
        context.settled.startRecording()
        let context = context.waiting(in: .bulk)
        // A resumed batch sends only what its earlier run did not settle; the rest is forgotten with its cursor.
        let unsent = { (pushes: [Push]) -> [Push] in
            guard !saved.settled.isEmpty else { return pushes }
            let left = pushes.filter { !saved.settled.contains($0.token) }
            metrics.resumedPushesSkipped.increment(by: UInt64(pushes.count - left.count))
            return left
        }
        let end = await withTaskGroup(of: FanOutEvent<Item>.self) { group -> FanOutEnd in
            var cursors: [(cursor: String, server: String?)] = [] // the scan position after each batch read, by batch number
            var loaded: [Int: [Push]] = [:] // batches read and not launched yet
            var tokens: [Int: [String]] = [:] // every token of a batch read and not settled yet
            var scanning = false
            var scanDone = false
            var nextToLaunch = 0
            var nextToSettle = 0
            var settled: [Int: Bool] = [:]
            var settledTokens: [Int: [String]] = [:] // by batch number: settled batches past the saved cursor
            var savedUpTo = 0 // batches before this one are recorded (or Redis refused their record)
            var saving = false
            var toSave: Int?
            let permitFrom = first == nil ? 0 : 1 // batch numbers from here hold a permit until settled
            func read(_ index: Int, _ pushes: [Push]) {
                tokens[index] = pushes.map(\.token)
                loaded[index] = unsent(pushes)
            }
            if let first {
                next = (first.cursor, first.server)
                cursors.append(next)
                read(0, first.pushes)
                scanDone = first.cursor == "0"
            }
            func startScan() {
                let cursor = next.cursor
                scanning = true
                group.addTask {
                    do { try await batchPermits.acquire(in: .bulk) } catch { return .cancelled }
                    do { return .scanned(try await retrying("scan targets") { try await scan(cursor) }) } catch {
                        batchPermits.release()
                        if let refusal = error as? StoreRefusal { return .refused(refusal) }
                        return .cancelled
                    }
                }
            }
            // Stops the children and gives back the permits of the batches not settled, a late scan's too.
            func end(_ reason: FanOutEnd) async -> FanOutEnd {
                group.cancelAll()
                var held = max(0, cursors.count - max(nextToSettle, permitFrom))
                while let event = await group.next() { if case .scanned = event { held += 1 } }
                batchPermits.release(count: held)
                return reason
            }
            func startSave(upTo count: Int) {
                let position = cursors[count - 1]
                // Only the batches this cursor covers: a later batch's marks must stay until a cursor passes it.
                let covered = settledTokens.filter { $0.key < count }.flatMap(\.value)
                settledTokens = settledTokens.filter { $0.key >= count }
                saving = true
                // Retried while Redis fails: launching waits `maxBatchesInFlight` past the last saved cursor, so a
                // crash meanwhile sends again no more than that. Redis refusing the record itself is logged and passed.
                group.addTask {
                    do {
                        try await retrying("save fan-out progress") {
                            try await context.settled.advance(cursor: position.cursor, server: position.server,
                                                              covering: covered)
                        }
                    } catch let refusal as StoreRefusal {
                        logger.error("Redis refuses the fan-out's progress; going on without it",
                                     ["job.id": context.plan.job.id, "error": refusal.error.message])
                    } catch {
                        return .cancelled
                    }
                    return .saved(count)
                }
            }
            while true {
                while let pushes = loaded[nextToLaunch], nextToLaunch - nextToSettle < maxBatchesInFlight,
                      nextToLaunch - savedUpTo <= maxBatchesInFlight {
                    loaded[nextToLaunch] = nil
                    let index = nextToLaunch
                    nextToLaunch += 1
                    group.addTask { .sent(index, await send(pushes, context: context)) }
                }
                if !scanning, !scanDone, cursors.count - nextToLaunch < Self.readAhead { startScan() }
                if scanDone, !scanning, nextToSettle == cursors.count, !saving { return .completed }
                switch await group.next() {
                case .scanned(let batch)?:
                    scanning = false
                    // `next` is still where this batch was scanned from: one scan runs at a time.
                    if next.cursor != "0", let server = batch.server, let from = next.server, server != from {
                        // Each Redis process hashes with a seed of its own: on another one (a replica promoted, a
                        // restart, the slot moved) the cursor points anywhere, and going on would skip targets.
                        batchPermits.release()
                        metrics.fanOutRescans.increment()
                        logger.warning("the Redis process holding the fan-out's targets changed mid-scan (a failover, a restart or a moved slot); "
                                       + "scanning again from the start: pushes already sent may go twice", ["job.id": context.plan.job.id])
                        next = ("0", nil)
                        break
                    }
                    let index = cursors.count
                    next = (batch.cursor, batch.server ?? next.server)
                    cursors.append(next)
                    scanDone = batch.cursor == "0"
                    if batch.items.isEmpty {
                        read(index, [])
                    } else {
                        let items = batch.items
                        group.addTask {
                            do { return .loaded(index, try await retrying("load targets") { try await load(items) }) }
                            catch let refusal as StoreRefusal { return .refused(refusal) } catch { return .cancelled }
                        }
                    }
                case .loaded(let index, let pushes)?:
                    read(index, pushes)
                case .sent(let index, let ok)?:
                    settled[index] = ok
                    guard ok else { return await end(.cancelled) }
                    let before = nextToSettle
                    while settled[nextToSettle] == true {
                        if nextToSettle >= permitFrom { batchPermits.release() }
                        settled[nextToSettle] = nil
                        settledTokens[nextToSettle] = tokens.removeValue(forKey: nextToSettle) ?? []
                        nextToSettle += 1
                    }
                    // Everything before this cursor is settled; only worth recording when more remains.
                    guard nextToSettle > before else { break }
                    if cursors[nextToSettle - 1].cursor == "0" {
                        if !saving { savedUpTo = nextToSettle }
                    } else if saving {
                        toSave = nextToSettle
                    } else {
                        startSave(upTo: nextToSettle)
                    }
                case .saved(let count)?:
                    saving = false
                    savedUpTo = max(savedUpTo, count)
                    if let next = toSave {
                        toSave = nil
                        startSave(upTo: next)
                    }
                case .refused(let refusal)?:
                    return await end(.refused(refusal))
                case .cancelled?, nil:
                    return await end(.cancelled)
                }
            }
        }
        switch end {
        case .completed: return true
        case .cancelled: return false
        case .refused(let refusal): throw refusal
        }
    }

    private enum FanOutEnd: Sendable {
        case completed, cancelled, refused(StoreRefusal)
    }

    /// Batches read from Redis ahead of the one sending next (each up to `batchSize` targets in memory).
    static let readAhead = 2

    private static func read<Item: Sendable>(
        from cursor: String, scan: @Sendable (String) async throws -> ScanPage<Item>,
        load: @Sendable ([Item]) async throws -> [Push]
    ) async throws -> (cursor: String, server: String?, pushes: [Push]) {
        let batch = try await scan(cursor)
        return (batch.cursor, batch.server, batch.items.isEmpty ? [] : try await load(batch.items))
    }

    /// A batch of a fan-out's targets as scanned: the next cursor and the Redis process that gave it (nil: not known).
    struct ScanPage<Item: Sendable>: Sendable {
        var cursor: String
        var items: [Item]
        var server: String?
    }

    /// What a fan-out's child tasks report.
    private enum FanOutEvent<Item: Sendable>: Sendable {
        case scanned(ScanPage<Item>)
        case loaded(Int, [Push])
        case sent(Int, Bool)
        /// Progress up to this batch number was saved (or the attempt failed and was logged).
        case saved(Int)
        /// A read gave up because the fan-out was cancelled.
        case cancelled
        /// A read gave up because Redis kept refusing it.
        case refused(StoreRefusal)
    }

    /// Sends one batch, each push holding a slot of the shared limit while in flight. Slots are taken a group of
    /// up to `pushesPerSend` at a time, and each group goes to the APNs client as one batch send per environment
    /// (one task and one hand-over instead of one per push); a group waits for all its slots, which answers
    /// free a group at a time, so the limit stays full of groups rather than of single pushes.
    private func send(_ pushes: [Push], context: JobContext) async -> Bool {
        await withTaskGroup(of: Bool.self) { group -> Bool in
            var next = pushes.startIndex
            while next < pushes.endIndex {
                let count = min(Self.pushesPerSend, limit.limit, pushes.endIndex - next)
                do { try await limit.acquire(count, in: context.lane) } catch { break }
                let slice = pushes[next..<(next + count)]
                next += count
                let production = slice.filter { $0.environment == .production }
                let sandbox = slice.filter { $0.environment != .production }
                for held in [production, sandbox] where !held.isEmpty {
                    group.addTask { await deliverer.deliver(held, context: context) }
                }
            }
            var all = !Task.isCancelled
            for await ok in group where !ok { all = false }
            return all && !Task.isCancelled
        }
    }

    /// Pushes per batch send: enough to make the per-send cost small per push, few enough that slots held until
    /// the slowest answer of a group leave most of `maxInFlightPushes` working.
    static let pushesPerSend = 100

    private func removePost(app: String, post: String) async -> Bool {
        await removeAfterFinal(app: app, what: "the post's registrations", ["post": post]) {
            try await activities.removePost(app: app, postIDHash: post)
        }
    }

    /// A channel's final event closes it: once every push settled, its subscriptions go.
    private func removeChannel(app: String, channel: String) async -> Bool {
        await removeAfterFinal(app: app, what: "the channel's subscriptions", ["channel": channel]) {
            try await subscriptions.removeChannel(app: app, channel: channel)
        }
    }

    /// Runs a final job's clean-up until it is done; false only when cancelled first (the job is then not
    /// settled and runs again). Redis refusing the data for good is logged and settles it: what is left expires.
    private func removeAfterFinal(app: String, what: String, _ fields: [String: String],
                                  _ body: () async throws -> Int) async -> Bool {
        do {
            let removed = try await retrying("remove \(what)", body)
            logger.info("final update sent; \(what) removed", fields.merging(["app": app, "removed": "\(removed)"]) { a, _ in a })
            return true
        } catch let refusal as StoreRefusal {
            logger.error("final update sent; Redis refused removing \(what), which expire by themselves",
                         fields.merging(["app": app, "error": refusal.error.message]) { a, _ in a })
            return true
        } catch {
            return false
        }
    }

    /// Runs `body` until it succeeds, waiting `retryDelay` after each failure (Redis down, say). Throws
    /// `CancellationError`, or `StoreRefusal` once Redis has answered with an error about the data
    /// `StoreRefusal.tries` times in a row.
    private func retrying<T: Sendable>(_ what: String, _ body: () async throws -> T) async throws -> T {
        var refusals = 0
        while true {
            try Task.checkCancellation()
            do { return try await body() } catch {
                if Task.isCancelled { throw CancellationError() }
                if let refused = StoreRefusal.dataError(error) {
                    refusals += 1
                    if refusals >= StoreRefusal.tries { throw StoreRefusal(what: what, tries: refusals, error: refused) }
                } else {
                    refusals = 0
                }
                logger.error("cannot \(what); retrying", ["error": "\(error)"])
                try await Task.sleep(for: retryDelay)
            }
        }
    }
}
