import Foundation
import HeraldCore
import HeraldRedis
import HeraldRuntime

/// The version of the key layout (`RedisKeys`) a Redis database holds, in `herald:layout`, so that no service reads
/// or writes keys laid out in a way it does not understand, and the path from an older layout.
///
/// - Layout 1 (before the marker): every key of an app under the app's hash tag `{app}`, so on a Redis Cluster
///   one app lived in one slot.
/// - Layout 2: subscriptions and Live Activity registrations under the tags of their device, channel, post, push
///   token and expiry bucket, spread over a cluster.
public enum RedisLayout {
    public static let current = 2
    public static let key = "herald:layout"

    /// The database's layout: the marker's version, or with no marker 1 when a subscription or registration of
    /// layout 1 exists and nil when none does (a new database, or one only ever written by this layout's tests and tools).
    public static func version(of redis: RedisClient) async throws -> Int? {
        if let marker = try await redis.command(["GET", key]).string {
            guard let version = Int(marker) else { throw LayoutError("\(key) holds \"\(marker)\", not a layout version") }
            return version
        }
        var found = false
        try await walkOldKeys(redis) { _ in
            found = true
            return false
        }
        return found ? 1 : nil
    }

    /// Makes sure the database holds this layout before a service uses it: marks a new database, and throws
    /// `LayoutError` (saying what to run) for any other layout. While Redis cannot be reached it asks again each
    /// second, logging once per `reportEvery`.
    public static func prepare(_ redis: RedisClient, logger: Logger, reportEvery: Duration = .seconds(10)) async throws {
        var lastReport: ContinuousClock.Instant?
        while true {
            do {
                switch try await version(of: redis) {
                case current?: return
                case nil:
                    try await redis.command(["SET", key, String(current), "NX"])
                case let old? where old < current:
                    throw LayoutError("""
                        Redis holds Herald's key layout \(old); this version needs layout \(current). Stop every \
                        herald-ingest and herald-dispatcher, run `heraldctl redis migrate`, then start this version
                        """)
                case let newer?:
                    throw LayoutError("Redis holds Herald's key layout \(newer), newer than this version's \(current): run a newer Herald")
                }
            } catch let error as RedisError where error.isConnectionFailure || error.code == .unavailable {
                if lastReport.map({ .now - $0 >= reportEvery }) ?? true {
                    logger.warning("waiting for redis to check its key layout", ["error": "\(error)"])
                    lastReport = .now
                }
                try await Task.sleep(for: .seconds(1))
            }
        }
    }

    /// What `migrate` did (or, in a dry run, would do).
    public struct Migration: Sendable, Equatable {
        /// Subscriptions moved to this layout, by app.
        public var subscriptions: [String: Int] = [:]
        /// Live Activity registrations moved to this layout, by app.
        public var registrations: [String: Int] = [:]
        /// Index keys of layout 1 deleted after the move (their entries are in this layout's indexes now).
        public var oldIndexes = 0
        public var total: Int { subscriptions.values.reduce(0, +) + registrations.values.reduce(0, +) }
    }

    /// Moves a database of layout 1 to this layout, then marks it. Resumable and idempotent: a batch of
    /// subscriptions and registrations is written in this layout, then, once every write succeeded, their old keys
    /// go, so a run stopped or failed anywhere is finished by running it again. Run it with every service stopped
    /// (they refuse to start meanwhile). `progress` is called every 1,000 records with the count so far. A dry run
    /// only counts.
    public static func migrate(_ redis: RedisClient, dryRun: Bool = false, batchSize: Int = 1000,
                               progress: (Int) -> Void = { _ in }) async throws -> Migration {
        var migration = Migration()
        var moved = 0
        try await walkOldKeys(redis, batchSize: batchSize) { found in
            for old in found {
                if old.isSubscription { migration.subscriptions[old.app, default: 0] += 1 }
                else { migration.registrations[old.app, default: 0] += 1 }
            }
            if !dryRun {
                let reads = try await redis.pipeline(found.flatMap { [["HGETALL", $0.key], ["PTTL", $0.key]] })
                // Read as unreadable, a record would only be deleted: an error other than a key of another type
                // (a node loading or failing over, a refused command) leaves the batch for the next run.
                for case .error(let message) in reads {
                    let error = RedisError.fromReply(message)
                    if !error.isAboutTheData { throw error }
                }
                let moves = found.enumerated().map { index, old in
                    let fields = reads[index * 2].fieldValues ?? [:]
                    return old.isSubscription ? moveSubscription(old, fields)
                        : moveRegistration(old, fields, ttl: reads[index * 2 + 1].int ?? -2)
                }
                // The old keys go only once every write is in: a refused write (OOM, a lost node) leaves the batch
                // in layout 1 for the next run.
                try throwFirstErrorReply(await redis.pipeline(moves.flatMap(\.writes)))
                try throwFirstErrorReply(await redis.pipeline(moves.flatMap(\.removals)))
            }
            let before = moved / 1000
            moved += found.count
            if moved / 1000 > before { progress(moved) }
            return true
        }
        guard !dryRun else { return migration }
        // What is left of layout 1's indexes names only records that no longer exist.
        try await walkOldKeys(redis, batchSize: batchSize, kinds: ["dev:", "ch:", "post:", "acttok:", "subexp"]) { stale in
            for old in stale { try await redis.command(["DEL", old.key]) }
            migration.oldIndexes += stale.count
            return true
        }
        try await redis.command(["SET", key, String(current)])
        return migration
    }

    /// A record's move: its writes in this layout, then the removal of its old keys.
    private struct Move {
        var writes: [[String]] = []
        var removals: [[String]]
    }

    /// A subscription of layout 1 written in this one (record, device index, channel index, expiry index), then
    /// its old keys removed. An unreadable record is only removed: nothing could push to it.
    private static func moveSubscription(_ old: OldKey, _ fields: [String: String]) -> Move {
        guard let id = fields["id"], let token = fields["deviceToken"], let channel = fields["channel"],
              let tokenType = fields["tokenType"].flatMap(TokenType.init(rawValue:)),
              let environment = fields["environment"].flatMap(APNsEnvironment.init(rawValue:)) else {
            return Move(removals: [["DEL", old.key]])
        }
        let keys = RedisKeys(app: old.app), oldPrefix = "herald:{" + old.app + "}:"
        let expiresAt = fields["expiresAt"].flatMap { Int64($0) }
        let target = ChannelTarget(deviceToken: token, tokenType: tokenType, environment: environment,
                                   activityID: fields["activityID"].flatMap { $0.isEmpty ? nil : $0 }, expiresAt: expiresAt)
        var writes = [["HSET", keys.subscription(id, token: token)] + fields.flatMap { [$0.key, $0.value] },
                      ["SADD", keys.device(token), id], ["HSET", keys.channel(channel), id, target.encoded]]
        if let expiresAt { writes.append(["ZADD", keys.subscriptionExpiry(id: id), String(expiresAt), id + token]) }
        return Move(writes: writes, removals: [["HDEL", oldPrefix + "ch:" + channel, id], ["ZREM", oldPrefix + "subexp", id],
                                               ["SREM", oldPrefix + "dev:" + token, id], ["DEL", old.key]])
    }

    /// A Live Activity registration of layout 1 written in this one with the time it has left (registration, post
    /// index, token index; each index lives a minute past its newest member), then its old keys removed.
    private static func moveRegistration(_ old: OldKey, _ fields: [String: String], ttl: Int64) -> Move {
        let id = String(old.rest.dropFirst("act:".count))
        guard ttl != -2, let post = fields["postIdHash"], let token = fields["pushToken"] else {
            return Move(removals: [["DEL", old.key]])
        }
        let keys = RedisKeys(app: old.app), oldPrefix = "herald:{" + old.app + "}:"
        let left = ttl > 0 ? ttl : 3_600_000
        let expiry = String(Int64(Date().timeIntervalSince1970 * 1000) + left), indexTTL = String(left + 60_000)
        let (postIndex, tokenIndex) = (keys.post(post), keys.activityToken(token))
        let writes = [["HSET", keys.registration(id, post: post)] + fields.flatMap { [$0.key, $0.value] },
                      ["PEXPIRE", keys.registration(id, post: post), String(left)],
                      ["ZADD", postIndex, expiry, id], ["PEXPIRE", postIndex, indexTTL, "NX"],
                      ["PEXPIRE", postIndex, indexTTL, "GT"],
                      ["ZADD", tokenIndex, expiry, id + post], ["PEXPIRE", tokenIndex, indexTTL, "NX"],
                      ["PEXPIRE", tokenIndex, indexTTL, "GT"]]
        return Move(writes: writes, removals: [["ZREM", oldPrefix + "post:" + post, id],
                                               ["ZREM", oldPrefix + "acttok:" + token, id], ["DEL", old.key]])
    }

    /// A record of layout 1: a subscription (`herald:{app}:sub:<id>`) or a registration (`herald:{app}:act:<id>`).
    private struct OldKey {
        var key: String
        var app: String
        var rest: Substring
        var isSubscription: Bool { rest.hasPrefix("sub:") }
    }

    /// Calls `body` with each master's next batch of layout-1 keys of `kinds` (the start of what follows the tag;
    /// records by default) until it returns false or every master has been walked.
    private static func walkOldKeys(_ redis: RedisClient, batchSize: Int = 1000, kinds: [String] = ["sub:", "act:"],
                                    _ body: ([OldKey]) async throws -> Bool) async throws {
        for master in try await redis.masters() {
            var cursor = "0"
            repeat {
                let page = try await master.command(["SCAN", cursor, "MATCH", "herald:{*}:*", "COUNT", String(batchSize)])
                guard let parts = page.array, parts.count == 2, let next = parts[0].string, let found = parts[1].strings else {
                    throw LayoutError("unexpected reply to SCAN from \(master.address)")
                }
                cursor = next
                let old = found.compactMap { key in
                    oldKey(key).flatMap { old in
                        kinds.contains { old.rest.hasPrefix($0) } ? OldKey(key: key, app: old.app, rest: old.rest) : nil
                    }
                }
                if !old.isEmpty, !(try await body(old)) { return }
            } while cursor != "0"
        }
    }

    /// The app and the rest of a layout-1 key `herald:{<app>}:<rest>`: a hash tag without `:` (this layout's
    /// tags name an entity after the app and a `:`).
    private static func oldKey(_ key: String) -> (app: String, rest: Substring)? {
        guard key.hasPrefix("herald:{"), let close = key.firstIndex(of: "}") else { return nil }
        let app = key[key.index(key.startIndex, offsetBy: 8)..<close]
        let rest = key[key.index(after: close)...]
        guard !app.isEmpty, !app.contains(":"), rest.hasPrefix(":") else { return nil }
        return (String(app), rest.dropFirst())
    }
}

/// A service's part that checks the key layout at start (`RedisLayout.prepare`, asking again while Redis cannot be
/// reached) and stops the service, by throwing, on a layout it cannot use. It runs beside the rest rather than
/// before it, so while Redis is down at start the service still answers (503, not ready) instead of nothing; the
/// parts that act on their own on Herald's keys (the job consumer, sweeps) start only once it passed (`gating`), so
/// that a job never reads a database of another layout, finds nothing and is committed as done.
public struct RedisLayoutCheck: Service {
    let redis: RedisClient
    let logger: Logger
    private let passed = Lock(false)

    public init(redis: RedisClient, logger: Logger) { (self.redis, self.logger) = (redis, logger) }

    public func run() async throws {
        try await RedisLayout.prepare(redis, logger: logger)
        passed.withLock { $0 = true }
        await waitForCancellation()
    }

    /// True once the database is known to hold this version's layout.
    public var hasPassed: Bool { passed.withLock { $0 } }

    /// `service`, started once the check has passed (never, when it fails or the group stops first).
    public func gating(_ service: any Service) -> any Service { Gated(check: self, service: service) }

    private struct Gated: Service {
        let check: RedisLayoutCheck
        let service: any Service

        func run() async throws {
            // Only at start, and `prepare` itself asks once a second while Redis is down.
            while !check.hasPassed { try await Task.sleep(for: .milliseconds(50)) }
            try await service.run()
        }
    }
}

/// The database holds a key layout this version cannot use.
public struct LayoutError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
