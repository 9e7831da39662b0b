import HeraldCore
import HeraldRedis

/// Where a fan-out has got to: the scan cursor up to which every push is settled, kept in Redis so that a
/// dispatcher that restarts (or takes over the partition) resumes there instead of from the first subscriber.
///
/// Key: `herald:progress:{<group>}:<topic>:<partition>:<offset>` — one per job record, so a re-delivered
/// record finds its own progress; deleted when the job settles, expiring after `ttl` otherwise.
struct FanOutProgress: Sendable {
    let redis: RedisClient
    let group: String
    let ttl: Duration

    func key(_ source: DeadLetter.Source) -> String {
        "herald:progress:{\(group)}:\(source.topic):\(source.partition):\(source.offset)"
    }

    func load(_ source: DeadLetter.Source) async throws -> String? {
        try await redis.command(["GET", key(source)]).string
    }

    func save(_ source: DeadLetter.Source, cursor: String) async throws {
        _ = try await redis.command(["SET", key(source), cursor, "EX", String(max(1, ttl.components.seconds))])
    }

    func clear(_ source: DeadLetter.Source) async throws {
        _ = try await redis.command(["DEL", key(source)])
    }
}
