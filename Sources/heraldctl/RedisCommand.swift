import Foundation
import HeraldRedis
import HeraldRuntime
import HeraldStore

/// `heraldctl redis migrate`: moves a database written by an older Herald to this version's key layout.
enum RedisCommand {
    static func migrate(_ flags: Flags) async throws {
        let connections = try Connections()
        let redis = try connections.redis()
        let dryRun = flags.has("dry-run")
        do {
            let before = try await RedisLayout.version(of: redis)
            if let before, before > RedisLayout.current {
                throw OperatorError("Redis holds key layout \(before), newer than this heraldctl's \(RedisLayout.current): use a newer heraldctl")
            }
            let migration = try await RedisLayout.migrate(redis, dryRun: dryRun) { moved in
                FileHandle.standardError.write(Data("migrate: \(moved) subscriptions moved so far\n".utf8))
            }
            let byApp = migration.subscriptions.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }
                .joined(separator: ", ")
            if dryRun {
                print("dry run: \(migration.total) subscriptions would move to layout \(RedisLayout.current)"
                      + (byApp.isEmpty ? "" : " (\(byApp))") + "; nothing was changed")
            } else {
                print("layout \(before.map(String.init) ?? "none") → \(RedisLayout.current): \(migration.total) subscriptions moved"
                      + (byApp.isEmpty ? "" : " (\(byApp))") + ", \(migration.oldIndexes) old index keys deleted")
            }
        } catch {
            await redis.close()
            throw connections.explain(error)
        }
        await redis.close()
    }
}
