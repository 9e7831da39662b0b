import HeraldAPNs
import HeraldCore
import HeraldRuntime

/// Keeps one wrong setting from deleting an app's audience. APNs answers 400 DeviceTokenNotForTopic to every token
/// when the apps file names a sibling app's bundle id, and 400 BadDeviceToken to every token when pushes go to the
/// wrong environment; each answer alone means the token is dead and is removed. After `threshold` of them in a row
/// for one app, topic and environment, with no push delivered there in between, removals are withheld: those
/// pushes are dead-lettered (replayable once the setting is fixed) and the tokens kept, until a push to that
/// topic and environment is delivered again. A 410 is about the token alone and is never withheld.
final class TokenRemovalGuard: Sendable {
    static let threshold = 50

    private struct Key: Hashable {
        var app: String
        var topic: String
        var environment: APNsEnvironment
    }

    /// 400 token refusals in a row per key since the last delivery there; empty in a healthy deployment.
    private let streaks = Lock<[Key: Int]>([:])
    /// Its series appears at the first withheld removal, so that the alert on it does not see a new pod's 0 as new.
    private let withheld: CounterFamily
    private let logger: Logger

    init(metrics: MetricsRegistry, logger: Logger) {
        withheld = metrics.counter("herald_dispatcher_token_removals_withheld_total",
                                   help: "Token removals withheld after \(Self.threshold) refusals in a row for one topic and environment (a wrong bundle id or environment): the pushes were dead-lettered, the tokens kept")
        self.logger = logger
    }

    /// Whether the token APNs refused with `response` may be removed now.
    func mayRemove(_ push: Push, _ response: APNsResponse, app: String) -> Bool {
        guard response.status == 400 else { return true }
        let key = Key(app: app, topic: push.topic, environment: push.environment)
        let streak = streaks.withLock { streaks -> Int in
            streaks[key, default: 0] += 1
            return streaks[key]!
        }
        guard streak > Self.threshold else { return true }
        if streak == Self.threshold + 1 {
            logger.error("APNs refused many tokens in a row for one topic and environment; keeping the tokens and dead-lettering their pushes until a push there is delivered", [
                "app": app, "apns.topic": push.topic, "apns.environment": push.environment.rawValue,
                "apns.reason": response.reason?.description ?? "", "refusals": "\(streak)",
                "hint": "check the app's bundleId in the apps file and the environment its tokens were registered for; replay the dead letters once fixed",
            ])
        }
        withheld.labels().increment()
        return false
    }

    /// True while some topic has refusals counted: only then do deliveries need to be reported.
    var isCounting: Bool { streaks.withLock { !$0.isEmpty } }

    /// A push delivered: its topic and environment start counting afresh.
    func delivered(_ push: Push, app: String) {
        streaks.withLock { streaks in
            guard !streaks.isEmpty else { return }
            streaks[Key(app: app, topic: push.topic, environment: push.environment)] = nil
        }
    }
}
