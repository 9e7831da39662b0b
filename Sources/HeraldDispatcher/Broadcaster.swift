import Foundation
import HeraldAPNs
import HeraldCore
import HeraldRuntime
import HeraldStore

/// A post's iOS 18 broadcast channels at APNs: made for a `broadcastChannel` job, published to once per update
/// (one request reaches every device that joined), deleted after the final update. APNs' answers are retried
/// as pushes are (backoff, `maxAttempts`); a broadcast that still fails is dead-lettered with its channel id.
struct Broadcaster: Sendable {
    let apns: APNsClient
    let channels: BroadcastChannelStore
    let deadLetters: DeadLetterWriter
    let maxAttempts: Int
    let backoff: RetryBackoff
    let infrastructureRetryDelay: Duration
    let logger: Logger

    /// Makes the post's channel in `request.environment` unless it has one, and stores it, or APNs' refusal for
    /// herald-ingest to report. False only when cancelled first.
    func createChannel(_ plan: JobPlan, post: String, _ request: PushJob.BroadcastChannel) async -> Bool {
        let app = plan.app.id
        guard let state = await store("read the post's channel", { try await channels.state(app: app, postIDHash: post,
                                                                                              environment: request.environment) })
        else { return !Task.isCancelled }
        if case .ready = state {
            // Asked for again, the post is in use: the janitor leaves its channels to a later idle spell.
            return await store("mark the post's channels in use", { try await channels.touch(app: app, postIDHash: post) }) != nil
                || !Task.isCancelled
        }
        guard await store("note the environment", { try await channels.markEnvironmentUsed(app: app, request.environment) })
            != nil else { return !Task.isCancelled }
        let bundle = plan.app.apns.bundleId
        guard let answer = await manage(.create(bundleID: bundle, storagePolicy: request.storagePolicy),
                                        credentials: plan.credentials, environment: request.environment) else { return false }
        switch answer {
        case .success(let response) where response.status == 201 && response.channelID != nil:
            let made = BroadcastChannel(channelID: response.channelID!, environment: request.environment,
                                        storagePolicy: request.storagePolicy, createdAt: Timestamp.rfc3339(Date()))
            guard let kept = await store("save the post's channel", { try await channels.save(app: app, postIDHash: post, made) })
            else { return !Task.isCancelled }
            if kept.channelID != made.channelID {
                // Another job made one first: ours would only count against Apple's cap.
                _ = await manage(.delete(bundleID: bundle, channelID: made.channelID), credentials: plan.credentials,
                                 environment: request.environment)
            }
            logger.info("broadcast channel ready", ["app": app, "post": post, "apns.environment": request.environment.rawValue,
                                                    "apns.channel_id": kept.channelID])
        case .success(let response):
            let reason = response.reason?.description ?? "HTTP \(response.status)"
            logger.error("APNs refused to create a broadcast channel", [
                "app": app, "post": post, "apns.environment": request.environment.rawValue, "apns.status": "\(response.status)",
                "apns.reason": reason, "hint": Self.hint(response.reason)])
            return await store("save APNs' refusal", {
                try await channels.saveRefusal(app: app, postIDHash: post, environment: request.environment,
                                               reason: reason, message: Self.hint(response.reason), jobID: plan.job.id)
            }) != nil || !Task.isCancelled
        case .failure(let error):
            logger.error("no answer from APNs to a channel request", ["app": app, "post": post, "error": "\(error)"])
            return await store("save the failure", {
                try await channels.saveRefusal(app: app, postIDHash: post, environment: request.environment,
                                               reason: error.kind, message: error.message, jobID: plan.job.id)
            }) != nil || !Task.isCancelled
        }
        return true
    }

    /// Publishes the post's update to each of its channels but those in `settled` (an earlier run of the record
    /// published them), marking each in the record's progress once settled. `settled` is false only when cancelled
    /// first; `exhausted` names the channels whose broadcast was dead-lettered after every attempt (APNs kept
    /// failing: a replay may get through, so a final update keeps those channels).
    func publish(_ context: JobContext, post: String,
                 settled: Set<String>) async -> (settled: Bool, exhausted: Set<String>) {
        guard let payload = context.plan.liveActivityPayload else { return (true, []) }
        let app = context.plan.app.id
        guard let list = await store("read the post's channels", { try await channels.channels(app: app, postIDHash: post) })
        else { return (!Task.isCancelled, []) }
        var exhausted: Set<String> = []
        for channel in list where !settled.contains(channel.channelID) {
            guard let published = await publish(payload, to: channel, context: context, post: post) else {
                return (false, exhausted)
            }
            if published == .deadLettered(exhausted: true) { exhausted.insert(channel.channelID) }
            await record(published, channel: channel, context: context)
        }
        guard !list.isEmpty else { return (true, exhausted) }
        // An update: the janitor deletes only channels of posts idle for HERALD_BROADCAST_IDLE_SECONDS.
        let touched = await store("mark the post's channels in use", { try await channels.touch(app: app, postIDHash: post) }) != nil
        return (touched || !Task.isCancelled, exhausted)
    }

    /// A `broadcast` job (`heraldctl replay` of a failed broadcast): its payload, once, to its channel.
    func publishReplay(_ context: JobContext, to target: PushJob.Target.Broadcast) async -> Bool {
        guard let payload = context.plan.job.payload?.encoded() else { return true }
        let channel = BroadcastChannel(channelID: target.channelId, environment: target.environment,
                                       storagePolicy: target.storagePolicy, createdAt: "")
        guard let published = await publish(payload, to: channel, context: context,
                                             post: context.plan.job.replayOf?.postIdHash) else { return false }
        context.settled.tallyBroadcast(delivered: published == .delivered)
        return true
    }

    /// Marks a post's settled broadcast in the job's progress and counts it in its status; a failure is logged.
    private func record(_ published: Published, channel: BroadcastChannel, context: JobContext) async {
        do {
            try await context.settled.broadcastSettled(channel.channelID, delivered: published == .delivered,
                                                       exhausted: published == .deadLettered(exhausted: true))
        } catch {
            logger.warning("cannot mark a broadcast settled; a run of the job again would publish it again, and its status "
                           + "does not count it", ["app": context.plan.app.id, "apns.channel_id": channel.channelID,
                                                   "error": "\(error)"])
        }
    }

    /// After the final update: deletes the post's channels at APNs, then forgets them. A channel APNs keeps
    /// refusing to delete is left in Redis (and logged) rather than holding the job. Channels in `keeping` (their
    /// final update was dead-lettered after every attempt) stay, so that its replay can still reach their devices;
    /// the janitor deletes them once the post is idle.
    func deleteChannels(_ plan: JobPlan, post: String, keeping: Set<String>) async -> Bool {
        let app = plan.app.id
        guard let list = await store("read the post's channels", { try await channels.channels(app: app, postIDHash: post) })
        else { return !Task.isCancelled }
        for channel in list {
            if keeping.contains(channel.channelID) {
                logger.warning("broadcast channel kept: its final update was dead-lettered; replay it, the janitor deletes the channel once the post is idle",
                               ["app": app, "post": post, "apns.channel_id": channel.channelID])
                continue
            }
            guard let deletion = await delete(channel, app: plan.app, credentials: plan.credentials, post: post) else {
                return false
            }
            if deletion == .deleted || deletion == .gone {
                logger.info("final update sent; broadcast channel deleted",
                            ["app": app, "post": post, "apns.channel_id": channel.channelID])
            }
        }
        return true
    }

    /// What became of a channel delete.
    enum ChannelDeletion {
        /// Deleted at APNs and forgotten.
        case deleted
        /// APNs no longer had it (`isGone`), and it is forgotten.
        case gone
        /// APNs refused this channel (a 400 about it, such as BadChannelId); the channel stays in Redis.
        case refused
        /// APNs refused the app or could not be reached, or Redis failed: other deletes would fare no better now.
        case failed
    }

    /// True for APNs' answers that say a channel no longer exists: ChannelNotRegistered, and FeatureNotEnabled, as
    /// turning the app's Broadcast capability off deletes every channel it had (enabled again, it starts with none).
    static func isGone(_ reason: APNsReason?) -> Bool { reason == .channelNotRegistered || reason == .featureNotEnabled }

    /// Deletes one of the post's channels at APNs, then forgets it; failures are logged. Nil when cancelled.
    func delete(_ channel: BroadcastChannel, app: App, credentials: APNsCredentials, post: String) async -> ChannelDeletion? {
        guard let answer = await manage(.delete(bundleID: app.apns.bundleId, channelID: channel.channelID),
                                        credentials: credentials, environment: channel.environment) else { return nil }
        guard case .success(let response) = answer, response.isSuccess || Self.isGone(response.reason) else {
            logger.error("APNs did not delete a broadcast channel",
                         ["app": app.id, "post": post, "apns.channel_id": channel.channelID, "answer": "\(answer)"])
            if case .success(let response) = answer, response.status == 400 {
                return .refused
            }
            return .failed
        }
        guard await store("forget the channel", {
            try await channels.remove(app: app.id, postIDHash: post, channel)
        }) != nil else { return Task.isCancelled ? nil : .failed }
        return response.isSuccess ? .deleted : .gone
    }

    /// What became of one broadcast.
    private enum Published: Equatable {
        case delivered
        /// `exhausted`: after every attempt of a failure worth retrying (else APNs refused it outright).
        case deadLettered(exhausted: Bool)
    }

    /// `post`: the channel's post, when known (a replay may not know it). Nil when cancelled first.
    private func publish(_ payload: [UInt8], to channel: BroadcastChannel, context: JobContext, post: String?) async -> Published? {
        let plan = context.plan
        let request = APNsBroadcastRequest(bundleID: plan.app.apns.bundleId, channelID: channel.channelID, payload: payload,
                                           priority: plan.priority, expiration: plan.expiration,
                                           storagePolicy: channel.storagePolicy)
        let first = Date()
        var failure = DeliveryFailure(status: nil, apnsReason: nil, error: nil, attempts: 0, firstAttemptAt: first,
                                      lastAttemptAt: first)
        var retryable = false
        for attempt in 1...max(1, maxAttempts) {
            failure.attempts = attempt
            do {
                let response = try await apns.publish(request, credentials: plan.credentials, environment: channel.environment)
                failure.lastAttemptAt = Date()
                if response.isSuccess { return .delivered }
                (failure.status, failure.apnsReason, failure.apnsUniqueID, failure.error) =
                    (response.status, response.reason?.description, response.uniqueID, nil)
                retryable = response.disposition == .retry || response.disposition == .refreshProviderToken
                if Self.isGone(response.reason), let post {
                    // Deleted at APNs (or never there): later updates would fail the same way.
                    _ = await store("forget the channel", {
                        try await channels.remove(app: plan.app.id, postIDHash: post, channel)
                    })
                }
            } catch let error as APNsError {
                (failure.status, failure.apnsReason, failure.error) = (nil, nil, error.kind)
                failure.lastAttemptAt = Date()
                retryable = error.isRetriable
            } catch {
                return nil
            }
            guard retryable, attempt < maxAttempts else { break }
            do { try await Task.sleep(for: backoff.delay(attempt: attempt)) } catch { return nil }
        }
        logger.warning("broadcast dead-lettered", ["app": plan.app.id, "post": post ?? "", "apns.channel_id": channel.channelID,
                                                   "apns.reason": failure.apnsReason ?? failure.error ?? ""])
        guard await deadLetters.write(DeadLetter(broadcast: channel, payload: payload, of: plan.job, source: context.source,
                                                 failure: failure,
                                                 disposition: retryable ? .retriesExhausted : .rejected)) else { return nil }
        return .deadLettered(exhausted: retryable)
    }

    /// One channel request, sent again after a backoff while APNs asks to retry or does not answer; nil when
    /// cancelled.
    func manage(_ request: APNsChannelRequest, credentials: APNsCredentials,
                environment: APNsEnvironment) async -> Result<APNsChannelResponse, APNsError>? {
        var last: Result<APNsChannelResponse, APNsError> = .failure(APNsError(.timeout, "not sent"))
        for attempt in 1...max(1, maxAttempts) {
            let retryable: Bool
            do {
                let response = try await apns.manage(request, credentials: credentials, environment: environment)
                last = .success(response)
                retryable = response.disposition == .retry || response.disposition == .refreshProviderToken
            } catch let error as APNsError {
                last = .failure(error)
                retryable = error.isRetriable
            } catch {
                return nil
            }
            guard retryable, attempt < maxAttempts else { return last }
            do { try await Task.sleep(for: backoff.delay(attempt: attempt)) } catch { return nil }
        }
        return last
    }

    /// Runs a Redis step until it succeeds (an outage is waited out); nil when cancelled, or when Redis answered
    /// about the data itself `StoreRefusal.tries` times in a row (logged; the caller then goes on without it).
    func store<T: Sendable>(_ what: String, _ body: () async throws -> T) async -> T? {
        var refusals = 0
        while !Task.isCancelled {
            do { return try await body() } catch {
                if let refused = StoreRefusal.dataError(error) {
                    refusals += 1
                    if refusals >= StoreRefusal.tries {
                        logger.error("Redis refuses to \(what); leaving it", ["error": refused.message])
                        return nil
                    }
                }
                logger.error("cannot \(what); retrying", ["error": "\(error)"])
                do { try await Task.sleep(for: infrastructureRetryDelay) } catch { return nil }
            }
        }
        return nil
    }

    /// What an operator should do about APNs refusing a channel.
    static func hint(_ reason: APNsReason?) -> String {
        switch reason {
        case .featureNotEnabled?: "enable the Broadcast capability for the app's bundle id on Apple's developer site"
        case .cannotCreateChannelConfig?: "the app has Apple's 10,000 channels in this environment: end posts (final updates delete their channels)"
        case .channelNotRegistered?: "APNs does not know the channel"
        default: "APNs refused the channel request"
        }
    }
}
