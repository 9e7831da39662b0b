import Foundation
import HeraldAPNs
import HeraldCore
import HeraldRuntime
import HeraldStore

/// Keeps each app's broadcast channels under Apple's cap of 10,000 per environment, every `interval`:
/// - deletes the channels of posts that saw no create or update for `idle` (a post whose final update never came);
/// - lists the channels at APNs (`all-channels`) and exports their count, `herald_broadcast_channels`;
/// - deletes channels APNs has but Redis does not know (a crash between create and save, a lost creation race)
///   once they were seen so a whole round apart, as a channel is made at APNs just before it is saved;
/// - forgets channels Redis has but APNs no longer knows (the Broadcast capability turned off deletes them all).
///
/// Several dispatchers running it at once is harmless: a second delete answers ChannelNotRegistered, and the
/// channel is forgotten. An app is listed in an environment once it asked APNs for a channel there, while it has channels
/// there in Redis, or had some at APNs at the last look, so apps that never broadcast cost Apple no requests.
struct BroadcastJanitor: Service {
    let apps: AppRegistry
    let channels: BroadcastChannelStore
    let broadcaster: Broadcaster
    let interval: Duration
    let idle: Duration
    let counts: GaugeFamily
    let cleaned: CounterFamily
    let logger: Logger

    init(apps: AppRegistry, broadcaster: Broadcaster, interval: Duration, idle: Duration, metrics: MetricsRegistry,
         logger: Logger) {
        (self.apps, self.channels, self.broadcaster) = (apps, broadcaster.channels, broadcaster)
        (self.interval, self.idle, self.logger) = (interval, idle, logger)
        counts = metrics.gauge("herald_broadcast_channels",
                               help: "Broadcast channels an app has at APNs, by environment, as of the janitor's last list (Apple's cap: 10,000)",
                               labels: ["app", "environment"])
        cleaned = metrics.counter("herald_broadcast_janitor_channels_total",
                                  help: "Broadcast channels the janitor deleted at APNs (idle, orphan) or forgot (gone at APNs)",
                                  labels: ["action"])
    }

    func run() async {
        var listedLastRound: Set<AppEnvironment> = []
        while !Task.isCancelled {
            var listed: Set<AppEnvironment> = []
            for app in apps.directory.apps.values.sorted(by: { $0.id < $1.id }) where !Task.isCancelled {
                guard let credentials = app.apnsCredentials else { continue }
                do {
                    try await deleteIdle(app, credentials: credentials)
                    listed.formUnion(try await reconcile(app, credentials: credentials, listedLastRound: listedLastRound))
                } catch {
                    logger.warning("broadcast janitor: cannot read Redis; next round retries",
                                   ["app": app.id, "error": "\(error)"])
                }
            }
            listedLastRound = listed
            do { try await Task.sleep(for: interval) } catch { return }
        }
    }

    private struct AppEnvironment: Hashable {
        var app: String
        var environment: APNsEnvironment
    }

    private func deleteIdle(_ app: App, credentials: APNsCredentials) async throws {
        let before = Int64((Date().timeIntervalSince1970 - idle.inSeconds) * 1000)
        // Posts left in the index (a channel APNs refused) are skipped, so a page of them cannot keep the janitor
        // from the idle posts behind them.
        var left = 0
        while !Task.isCancelled {
            let posts = try await channels.idlePosts(app: app.id, before: before, skipping: left,
                                                     limit: BroadcastChannelStore.pageSize)
            posts: for post in posts {
                for channel in try await channels.channels(app: app.id, postIDHash: post) {
                    // Used since the page was read, or since its other channel's delete (which may have waited out
                    // APNs' answers): not idle after all, and out of the range read.
                    guard let used = try await channels.lastUsed(app: app.id, postIDHash: post), used < before else {
                        continue posts
                    }
                    switch await broadcaster.delete(channel, app: app, credentials: credentials, post: post) {
                    case .deleted?:
                        cleaned.labels("idle_deleted").increment()
                        logger.info("broadcast channel of an idle post deleted",
                                    ["app": app.id, "post": post, "apns.channel_id": channel.channelID])
                    case .gone?:
                        cleaned.labels("forgotten").increment()
                        logger.info("broadcast channel of an idle post gone at APNs; forgotten",
                                    ["app": app.id, "post": post, "apns.channel_id": channel.channelID])
                    case .refused?:
                        break  // the channel stays; tried again next round
                    case .failed?, nil:
                        return  // the next round tries again
                    }
                }
                if try await !channels.unindexIfEmpty(app: app.id, postIDHash: post) { left += 1 }
            }
            guard posts.count == BroadcastChannelStore.pageSize else { return }
        }
    }

    /// Lists the app's channels at APNs in each environment it has or had channels in, or asked APNs for one in;
    /// returns those listed.
    private func reconcile(_ app: App, credentials: APNsCredentials,
                           listedLastRound: Set<AppEnvironment>) async throws -> Set<AppEnvironment> {
        let known = try await channels.indexedChannels(app: app.id)
        let used = try await channels.usedEnvironments(app: app.id)
        let environments = APNsEnvironment.allCases.filter { environment in
            listedLastRound.contains(AppEnvironment(app: app.id, environment: environment))
                || used.contains(environment) || known.contains { $0.channel.environment == environment }
        }
        var atAPNs: [APNsEnvironment: Set<String>] = [:]
        for environment in environments {
            guard let answer = await broadcaster.manage(.list(bundleID: app.apns.bundleId), credentials: credentials,
                                                        environment: environment) else { return [] }
            guard case .success(let response) = answer, response.isSuccess, let listed = response.channels else {
                logger.warning("broadcast janitor: APNs did not list the app's channels", [
                    "app": app.id, "apns.environment": environment.rawValue, "answer": "\(answer)",
                    "hint": Broadcaster.hint(answerReason(answer))])
                continue
            }
            atAPNs[environment] = Set(listed)
            counts.labels(app.id, environment.rawValue).set(Int64(listed.count))
        }
        guard !atAPNs.isEmpty else { return [] }
        // Read after the lists: a channel listed but saved since is then known.
        let inRedis = try await channels.indexedChannels(app: app.id)
        // Apple lists a bundle's channels: those of another app with the same bundle id are no orphans.
        var siblings: Set<String> = []
        for other in apps.directory.apps.values where other.id != app.id && other.apns.bundleId == app.apns.bundleId {
            siblings.formUnion(try await channels.indexedChannels(app: other.id).map(\.channel.channelID))
        }
        for (environment, listed) in atAPNs.sorted(by: { $0.key.rawValue < $1.key.rawValue }) {
            let known = inRedis.filter { $0.channel.environment == environment }
            try await deleteOrphans(app, credentials: credentials, environment: environment,
                                    orphans: listed.subtracting(known.map(\.channel.channelID)).subtracting(siblings))
            for (post, channel) in known where !listed.contains(channel.channelID) {
                try await forgetIfGone(app, credentials: credentials, post: post, channel: channel)
            }
        }
        return Set(atAPNs.keys.map { AppEnvironment(app: app.id, environment: $0) })
    }

    private func deleteOrphans(_ app: App, credentials: APNsCredentials, environment: APNsEnvironment,
                               orphans: Set<String>) async throws {
        let prefix = environment.rawValue + ":"
        let sightings = try await channels.orphanSightings(app: app.id).filter { $0.key.hasPrefix(prefix) }
        let seenBefore = Int64((Date().timeIntervalSince1970 - interval.inSeconds) * 1000)
        var seen: [String] = [], gone: [String] = []
        for field in sightings.keys where !orphans.contains(String(field.dropFirst(prefix.count))) { gone.append(field) }
        for orphan in orphans.sorted() {
            let field = prefix + orphan
            guard let first = sightings[field], first <= seenBefore else {
                seen.append(field)
                continue
            }
            guard let answer = await broadcaster.manage(.delete(bundleID: app.apns.bundleId, channelID: orphan),
                                                        credentials: credentials, environment: environment) else { break }
            if case .success(let response) = answer, response.isSuccess || response.reason == .channelNotRegistered {
                gone.append(field)
                cleaned.labels("orphan_deleted").increment()
                logger.info("broadcast channel unknown to Redis deleted at APNs",
                            ["app": app.id, "apns.environment": environment.rawValue, "apns.channel_id": orphan])
            }
        }
        try await channels.updateOrphanSightings(app: app.id, seen: seen, gone: gone)
    }

    /// A channel Redis knows but APNs did not list: asked about by itself, and forgotten once APNs says it does
    /// not know it (it may have been made after the list).
    private func forgetIfGone(_ app: App, credentials: APNsCredentials, post: String,
                              channel: BroadcastChannel) async throws {
        guard case .success(let response)? = await broadcaster.manage(
            .read(bundleID: app.apns.bundleId, channelID: channel.channelID), credentials: credentials,
            environment: channel.environment), response.reason == .channelNotRegistered else { return }
        try await channels.remove(app: app.id, postIDHash: post, channel)
        cleaned.labels("forgotten").increment()
        logger.warning("broadcast channel gone at APNs; forgotten", [
            "app": app.id, "post": post, "apns.environment": channel.environment.rawValue,
            "apns.channel_id": channel.channelID])
    }

    private func answerReason(_ answer: Result<APNsChannelResponse, APNsError>) -> APNsReason? {
        if case .success(let response) = answer { response.reason } else { nil }
    }
}
