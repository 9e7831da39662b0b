import Foundation
import HeraldCore
import HeraldKafka
import HeraldRuntime
import HeraldStore

/// Runs one job record to the end: validates it (dead-lettering an invalid one), resolves its targets in
/// batches, delivers every push and, for a post's final update, removes the post's registrations.
struct JobRunner: Sendable {
    let apps: AppRegistry
    let subscriptions: SubscriptionStore
    let activities: ActivityStore
    let deliverer: Deliverer
    let deadLetters: DeadLetterWriter
    let progress: FanOutProgress
    let limit: ConcurrencyLimit
    let batchSize: Int
    let maxBatchesInFlight: Int
    let retryDelay: Duration
    let metrics: DispatcherMetrics
    let logger: Logger

    /// True when every push of the job is settled (the offset may be committed); false when cancelled first.
    func run(_ record: KafkaRecord) async -> Bool {
        metrics.jobsConsumed.increment()
        let source = DeadLetterEntry.Source(topic: record.topic, partition: record.partition, offset: record.offset,
                                       key: record.key)
        let timestamp = Int64(Date().timeIntervalSince1970)
        let plan: JobPlan
        var parsed: PushJob?
        do throws(ValidationError) {
            let job = try PushJob.decode(record.value)
            parsed = job
            try job.validate()
            guard let app = apps.directory.apps[job.appId] else {
                throw ValidationError(code: "unknown_app", message: "app \(job.appId) is not in the apps file",
                                      field: "appId")
            }
            do { plan = try JobPlan(job: job, app: app, timestamp: timestamp) } catch { throw error.error }
        } catch {
            metrics.jobsInvalid.increment()
            return await deadLetters.write(DeadLetterEntry(
                reason: .invalidJob, message: error.description, source: source, job: nil,
                rawJob: record.value, jobId: parsed?.id, appId: parsed?.appId))
        }
        let context = JobContext(plan: plan, source: source, record: record.value)
        let settled: Bool
        switch plan.job.target.kind {
        case .device:
            guard let push = plan.devicePush(timestamp: timestamp) else { return true }
            do { try await limit.acquire() } catch { return false }
            settled = await deliverer.deliver(push, context: context)
        case .channel:
            let channel = plan.job.target.channel ?? ""
            settled = await fanOut(context) { cursor in
                let batch = try await subscriptions.channelBatch(app: plan.app.id, channel: channel, cursor: cursor,
                                                                 count: batchSize)
                return (batch.cursor, batch.targets.compactMap(plan.push(for:)))
            }
        case .post:
            let post = plan.job.target.postIdHash ?? ""
            settled = await fanOut(context) { cursor in
                let batch = try await activities.postBatch(app: plan.app.id, postIDHash: post, cursor: cursor,
                                                           count: batchSize)
                return (batch.cursor, batch.registrations.compactMap(plan.push(for:)))
            }
            if settled, plan.job.isFinal {
                guard await removePost(app: plan.app.id, post: post) else { return false }
            }
        }
        if settled { metrics.jobsCompleted.increment() }
        return settled
    }

    /// Streams the targets batch by batch (bounded memory whatever their number), keeps up to
    /// `maxBatchesInFlight` batches sending at once, and records the cursor up to which every push is settled.
    private func fanOut(_ context: JobContext,
                        scan: @escaping @Sendable (String) async throws -> (cursor: String, pushes: [Push])) async -> Bool {
        let source = context.source
        // The first batch is read while the saved progress is looked up: nearly every fan-out has none (one
        // Redis round trip saved on the latency of every small job); a resumed one discards that batch.
        async let fromStart = try? scan("0")
        let start: String
        do { start = try await retrying("load fan-out progress") { try await progress.load(source) } ?? "0" } catch {
            return false
        }
        var prefetched = start == "0" ? await fromStart : nil
        if start != "0" {
            metrics.resumedFanOuts.increment()
            logger.info("resuming a fan-out from its saved cursor", ["job.id": context.plan.job.id, "cursor": start])
        }
        var saved = start != "0"
        let completed = await withTaskGroup(of: (Int, Bool).self) { group -> Bool in
            var cursor = start
            var cursors: [String] = [] // the scan cursor after each launched batch
            var settled: [Int: Bool] = [:]
            var nextToSettle = 0
            var scanning = true
            while scanning || nextToSettle < cursors.count {
                if scanning, cursors.count - nextToSettle < maxBatchesInFlight {
                    let batch: (cursor: String, pushes: [Push])
                    do {
                        let from = cursor
                        if let first = prefetched {
                            batch = first
                            prefetched = nil
                        } else {
                            batch = try await retrying("scan targets") { try await scan(from) }
                        }
                    } catch {
                        group.cancelAll()
                        return false
                    }
                    let index = cursors.count
                    cursors.append(batch.cursor)
                    cursor = batch.cursor
                    scanning = batch.cursor != "0"
                    group.addTask { (index, await send(batch.pushes, context: context)) }
                    continue
                }
                guard let (index, ok) = await group.next() else { break }
                settled[index] = ok
                guard ok else {
                    group.cancelAll()
                    return false
                }
                var advanced = false
                while settled[nextToSettle] == true {
                    settled[nextToSettle] = nil
                    nextToSettle += 1
                    advanced = true
                }
                // Everything before this cursor is settled; only worth recording when more remains.
                if advanced, cursors[nextToSettle - 1] != "0" {
                    let position = cursors[nextToSettle - 1]
                    do {
                        try await progress.save(source, cursor: position)
                        saved = true
                    } catch {
                        logger.warning("cannot save fan-out progress", ["error": "\(error)", "job.id": context.plan.job.id])
                    }
                }
            }
            return true
        }
        guard completed else { return false }
        if saved {
            do { try await retrying("clear fan-out progress") { try await progress.clear(source) } } catch { return false }
        }
        return true
    }

    /// Sends one batch, each push holding a slot of the shared limit while in flight. Pushes go to the APNs client
    /// in groups of up to `pushesPerSend` of one environment (one task and one batch send per group instead of
    /// per push); a group is sent early when the limit is full, so no slot is held by a push waiting for others.
    private func send(_ pushes: [Push], context: JobContext) async -> Bool {
        await withTaskGroup(of: Bool.self) { group -> Bool in
            var production: [Push] = []
            var sandbox: [Push] = []
            for push in pushes {
                if !limit.tryAcquire() {
                    for held in [production, sandbox] where !held.isEmpty {
                        group.addTask { await deliverer.deliver(held, context: context) }
                    }
                    production.removeAll()
                    sandbox.removeAll()
                    do { try await limit.acquire() } catch { break }
                }
                if push.environment == .production {
                    production.append(push)
                    if production.count == Self.pushesPerSend {
                        group.addTask { [production] in await deliverer.deliver(production, context: context) }
                        production.removeAll()
                    }
                } else {
                    sandbox.append(push)
                    if sandbox.count == Self.pushesPerSend {
                        group.addTask { [sandbox] in await deliverer.deliver(sandbox, context: context) }
                        sandbox.removeAll()
                    }
                }
            }
            for held in [production, sandbox] where !held.isEmpty {
                group.addTask { await deliverer.deliver(held, context: context) }
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
        do {
            let removed = try await retrying("remove the post's registrations") {
                try await activities.removePost(app: app, postIDHash: post)
            }
            logger.info("final update sent; registrations removed", ["app": app, "post": post, "removed": "\(removed)"])
            return true
        } catch {
            return false
        }
    }

    /// Runs `body` until it succeeds, waiting `retryDelay` after each failure (Redis down, say); throws only
    /// `CancellationError`.
    private func retrying<T: Sendable>(_ what: String, _ body: () async throws -> T) async throws -> T {
        while true {
            try Task.checkCancellation()
            do { return try await body() } catch {
                if Task.isCancelled { throw CancellationError() }
                logger.error("cannot \(what); retrying", ["error": "\(error)"])
                try await Task.sleep(for: retryDelay)
            }
        }
    }
}
