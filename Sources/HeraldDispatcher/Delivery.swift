import Foundation
import HeraldAPNs
import HeraldCore
import HeraldCrypto
import HeraldRedis
import HeraldRuntime
import HeraldStore

/// Exponential backoff with jitter between attempts of one push.
struct RetryBackoff: Sendable {
    var initial: Duration
    var maximum: Duration

    /// Uniformly between half and all of `initial × 2^(attempt-1)`, capped at `maximum`: retries of many tokens
    /// that failed together spread out instead of hitting APNs again at the same instant.
    func delay(attempt: Int) -> Duration {
        let ceiling = min(maximum, initial * (1 << min(max(attempt - 1, 0), 30)))
        return ceiling * Double.random(in: 0.5...1.0)
    }
}

/// What a job's pushes share: the plan, where the job came from (for dead letters), and where each push is
/// recorded as it settles (the job's status and, for a fan-out, its progress), and the lane its pushes wait for
/// slots in (a fan-out past one send waits behind small jobs).
struct JobContext: Sendable {
    let plan: JobPlan
    let source: DeadLetter.Source
    let settled: SettledPushes
    var lane: ConcurrencyLimit.Lane = .prompt

    func waiting(in lane: ConcurrencyLimit.Lane) -> JobContext {
        var context = self
        context.lane = lane
        return context
    }
}

/// Sends one push through the APNs client and settles it: delivered, token removed, or dead-lettered after
/// the allowed attempts. Concurrency is bounded by the shared `limit`; a push waiting for its next attempt
/// holds no slot.
struct Deliverer: Sendable {
    let apns: APNsClient
    let subscriptions: SubscriptionStore
    let activities: ActivityStore
    let deadLetters: DeadLetterWriter
    let removals: TokenRemovalGuard
    let limit: ConcurrencyLimit
    let maxAttempts: Int
    let backoff: RetryBackoff
    let infrastructureRetryDelay: Duration
    let metrics: DispatcherMetrics
    let logger: Logger

    /// Settles `push`; the caller already holds one slot of `limit`, which is released here. Returns false only
    /// when the task was cancelled before the push settled (its job's offset must then not be committed).
    func deliver(_ push: Push, context: JobContext) async -> Bool {
        await attempt(push, context: context, holding: true, after: 0, first: nil)
    }

    /// Settles `pushes`, all for one environment; the caller already holds one slot of `limit` per push, released
    /// here when the first attempts are answered. The first attempts go out as one batch (one task suspension and
    /// one hand-over to the APNs client's loop for all of them, where one push each cost more CPU than the
    /// request itself); a push that needs more — a retry, token removal, a dead letter — then continues on its
    /// own, exactly as `deliver(_:context:)` would. Returns false only when cancelled before every push settled.
    func deliver(_ pushes: [Push], context: JobContext) async -> Bool {
        guard let environment = pushes.first?.environment else { return true }
        let requests = pushes.map(context.plan.request(for:))
        let started = ContinuousClock.now
        let first = Date()
        metrics.inFlightPushes.add(Int64(pushes.count))
        let results: [Result<APNsResponse, APNsError>]
        do {
            results = try await apns.send(requests, credentials: context.plan.credentials,
                                          environment: environment == .production ? .production : .sandbox)
        } catch {
            metrics.inFlightPushes.add(-Int64(pushes.count))
            limit.release(count: pushes.count)
            return false // cancelled
        }
        metrics.pushLatency.observe(Histogram.seconds(since: started), count: UInt64(pushes.count))
        let last = Date()
        var unsettled: [(Push, Outcome)] = []
        var delivered: [SettledPush] = []
        let reportDeliveries = removals.isCounting
        for (push, result) in zip(pushes, results) {
            switch result {
            case .success(let response) where response.disposition == .delivered:
                countAnswer(push, response)
                delivered.append(SettledPush(token: push.token, outcome: .delivered, retries: 0))
                if reportDeliveries { removals.delivered(push, app: context.plan.app.id) }
            case .success(let response): unsettled.append((push, .answered(response)))
            case .failure(let error): unsettled.append((push, .failed(error)))
            }
        }
        // In flight until recorded: a crash before the record sends these again, and no more than these.
        await context.settled.record(delivered)
        metrics.inFlightPushes.add(-Int64(pushes.count))
        limit.release(count: pushes.count)
        if Task.isCancelled { return false }
        if let created = context.plan.createdAt {
            metrics.endToEnd.observe(last.timeIntervalSince(created), count: UInt64(delivered.count))
        }
        guard !unsettled.isEmpty else { return true }
        return await withTaskGroup(of: Bool.self) { group -> Bool in
            for (push, outcome) in unsettled {
                group.addTask {
                    if let settled = await settle(push, outcome, attempt: 1, first: first, sent: first, last: last,
                                                  context: context) {
                        return settled
                    }
                    return await attempt(push, context: context, holding: false, after: 1, first: first)
                }
            }
            var all = true
            for await ok in group where !ok { all = false }
            return all
        }
    }

    /// Sends `push` until it settles, from attempt `previous + 1`; `holding` says whether the caller's slot of
    /// `limit` is still held (it is released here either way).
    private func attempt(_ push: Push, context: JobContext, holding: Bool, after previous: Int, first: Date?) async -> Bool {
        var holding = holding
        defer { if holding { limit.release() } }
        let request = context.plan.request(for: push)
        let environment = push.environment
        var first = first
        var attempt = previous
        while true {
            if !holding {
                do { try await limit.acquire(in: context.lane) } catch { return false }
                holding = true
            }
            attempt += 1
            let started = ContinuousClock.now
            let now = Date()
            if first == nil { first = now }
            metrics.inFlightPushes.add(1)
            let outcome: Outcome
            do {
                let response = try await apns.send(request, credentials: context.plan.credentials, environment: environment)
                outcome = .answered(response)
            } catch let error as APNsError {
                outcome = .failed(error)
            } catch {
                metrics.inFlightPushes.add(-1)
                return false // cancelled
            }
            metrics.pushLatency.observe(since: started)
            if case .answered(let response) = outcome, response.disposition == .delivered {
                await context.settled.record([SettledPush(token: push.token, outcome: .delivered, retries: attempt - 1)])
            }
            metrics.inFlightPushes.add(-1)
            limit.release()
            holding = false
            let last = Date()
            if Task.isCancelled { return false }
            if let settled = await settle(push, outcome, attempt: attempt, first: first ?? now, sent: now, last: last,
                                          context: context) {
                return settled
            }
        }
    }

    /// Acts on one attempt's outcome (the attempt `sent` then and answered at `last`): true when the push is
    /// settled (delivered, token removed, dead-lettered), false when cancelled, nil when it is to be sent again
    /// (the backoff has been waited).
    private func settle(_ push: Push, _ outcome: Outcome, attempt: Int, first: Date, sent: Date, last: Date,
                        context: JobContext) async -> Bool? {
        var failure = DeliveryFailure(status: nil, apnsReason: nil, error: nil, attempts: attempt,
                                              firstAttemptAt: first, lastAttemptAt: last)
        let retryable: Bool
        switch outcome {
        case .answered(let response):
            countAnswer(push, response)
            switch response.disposition {
            case .delivered:
                if let created = context.plan.createdAt { metrics.endToEnd.observe(last.timeIntervalSince(created)) }
                removals.delivered(push, app: context.plan.app.id)
                return true
            case .removeToken:
                guard removals.mayRemove(push, response, app: context.plan.app.id) else {
                    retryable = false // withheld: dead-lettered, the token kept
                    break
                }
                // Keep what was (re-)registered after the token stopped being valid: a 410's timestamp says
                // when; otherwise the push was refused as sent, so a registration made since is kept.
                let keepAfter = response.status == 410 ? response.timestamp ?? sent : sent
                guard await removeToken(push, app: context.plan.app.id, keepAfter: keepAfter) else { return false }
                await context.settled.record([SettledPush(token: push.token, outcome: .tokenRemoved, retries: attempt - 1)])
                return true
            case .retry, .refreshProviderToken:
                // ExpiredProviderToken seen here means the client could not re-sign yet (20-minute rule).
                retryable = true
            case .permanent:
                retryable = false
            }
            failure.status = response.status
            failure.apnsReason = response.reason?.description
            failure.apnsUniqueID = response.uniqueID
        case .failed(let error):
            count(push, status: "error", reason: error.kind)
            retryable = error.isRetriable
            failure.error = error.kind
        }
        if retryable, attempt < maxAttempts {
            metrics.retries.labels(failure.apnsReason.map { APNsReason($0).metricLabel } ?? failure.error ?? "").increment()
            do { try await Task.sleep(for: backoff.delay(attempt: attempt)) } catch { return false }
            return nil
        }
        guard await deadLetters.write(DeadLetter(push: push, of: context.plan.job, source: context.source, failure: failure,
                                                 disposition: retryable ? .retriesExhausted : .rejected)) else { return false }
        await context.settled.record([SettledPush(token: push.token, outcome: .deadLettered, retries: attempt - 1)])
        return true
    }

    private func countAnswer(_ push: Push, _ response: APNsResponse) {
        if response.status == 200, push.pushType == .alert {
            metrics.deliveredAlert.increment()
        } else if response.status == 200, push.pushType == .liveactivity {
            metrics.deliveredLiveActivity.increment()
        } else {
            count(push, status: String(response.status), reason: response.reason?.metricLabel ?? "")
        }
    }

    private enum Outcome {
        case answered(APNsResponse)
        case failed(APNsError)
    }

    private func count(_ push: Push, status: String, reason: String) {
        metrics.pushes.labels(push.pushType.rawValue, status, reason).increment()
    }

    /// Removes every subscription and registration of the token in the app (except those renewed after
    /// `keepAfter`), retrying while Redis fails; after `StoreRefusal.tries` answers about the data in a row the
    /// token is left (its next push is refused the same way and tries again) rather than holding the job.
    private func removeToken(_ push: Push, app: String, keepAfter: Date) async -> Bool {
        var refusals = 0
        while !Task.isCancelled {
            do {
                let subscriptions = try await self.subscriptions.removeInvalidToken(app: app, deviceToken: push.token,
                                                                                   keepUpdatedAfter: keepAfter)
                let registrations = try await activities.removeInvalidToken(app: app, pushToken: push.token,
                                                                            keepSeenAfter: keepAfter)
                metrics.tokensRemoved.labels("subscription").increment(by: UInt64(subscriptions))
                metrics.tokensRemoved.labels("registration").increment(by: UInt64(registrations))
                logger.debug("removed an invalid token", ["token": Redaction.tag(push.token), "app": app,
                                                         "removed.subscriptions": "\(subscriptions)",
                                                         "removed.registrations": "\(registrations)"])
                return true
            } catch {
                if let refused = StoreRefusal.dataError(error) {
                    refusals += 1
                    if refusals >= StoreRefusal.tries {
                        logger.error("Redis refuses removing an invalid token; leaving it",
                                     ["error": refused.message, "app": app, "token": Redaction.tag(push.token)])
                        return true
                    }
                } else {
                    refusals = 0
                }
                logger.error("cannot remove an invalid token; retrying", ["error": "\(error)", "app": app])
                do { try await Task.sleep(for: infrastructureRetryDelay) } catch { return false }
            }
        }
        return false
    }
}
