import HeraldCore
import HeraldRuntime
import HeraldStore

/// Removes subscriptions that were not renewed within their lifetime (`HERALD_SUBSCRIPTION_TTL_DAYS`, set by
/// ingest) from every index, every `interval`, app by app, a bounded batch per Redis call. Until then readers skip
/// them, so an expired subscription receives nothing either way. Several dispatchers sweeping at once is harmless:
/// each removal checks the expiry again.
struct SubscriptionSweeper: Service {
    let apps: AppRegistry
    let subscriptions: SubscriptionStore
    let interval: Duration
    let expired: Counter
    let logger: Logger

    init(apps: AppRegistry, subscriptions: SubscriptionStore, interval: Duration = .seconds(60),
         metrics: MetricsRegistry, logger: Logger) {
        (self.apps, self.subscriptions, self.interval, self.logger) = (apps, subscriptions, interval, logger)
        expired = metrics.counter("herald_dispatcher_subscriptions_expired_total",
                                  help: "Subscriptions removed because they were not renewed within their lifetime").labels()
    }

    func run() async {
        while !Task.isCancelled {
            for app in apps.directory.apps.keys.sorted() where !Task.isCancelled {
                do {
                    let removed = try await subscriptions.expire(app: app)
                    if removed > 0 {
                        expired.increment(by: UInt64(removed))
                        logger.info("expired subscriptions removed", ["app": app, "removed": String(removed)])
                    }
                } catch let incomplete as SubscriptionStore.SweepIncomplete {
                    expired.increment(by: UInt64(incomplete.removed))
                    logger.warning("expired subscriptions Redis cannot read are left; the rest were removed",
                                   ["app": app, "removed": String(incomplete.removed), "error": "\(incomplete.error)"])
                } catch {
                    logger.warning("cannot sweep expired subscriptions; next round retries", ["app": app, "error": "\(error)"])
                }
            }
            do { try await Task.sleep(for: interval) } catch { return }
        }
    }
}
