import HeraldCore
import HeraldHTTP
@testable import HeraldIngest
import HeraldRedis
import HeraldRuntime
import HeraldStore
import HeraldTestSupport
import Testing

/// The rate-limit headers on answers the HTTP suites cannot provoke at will: a handler failing after its request
/// was counted.
@Suite("Rate-limit headers on failed requests")
struct GatekeeperTests {
    private struct Unexpected: Error {}

    @Test("a request that fails after it was counted says where its window stands, whether 503 or 500")
    func failuresAfterCountingCarryTheWindow() async throws {
        let apps = try TestApps()
        defer { apps.remove() }
        let redis = RedisClient(configuration: try RedisConfiguration(url: try TestEnvironment.redisURL()))
        let limiter = RateLimiter(redis: redis, limit: 100)
        let gate = Gatekeeper(apps: AppRegistry(apps.ingestDirectory, reader: .ingest), limiter: limiter,
                              clockSkew: .seconds(60), logger: Logger(label: "test", minimumLevel: .error))
        let app = apps.apps[0]
        for (failure, status) in [(HTTPError.unavailable("down") as any Error, 503), (Unexpected(), 500)] {
            let selfCounting = gate.selfCountingEndpoint(.device) { _, _, meter in
                meter.record(try await limiter.hit(meter.window(device: nil)))
                throw failure
            }
            let admitted = gate.endpoint(.producer) { _, _ in throw failure }
            for (handler, key) in [(selfCounting, app.publicKey), (admitted, app.secretKey)] {
                var headers = HTTPHeaders()
                headers.add("X-API-Key", key)
                let request = HTTPRequest(method: .post, path: "/v1/apps/\(app.id)/x", route: "/v1/apps/{appID}/x",
                                          pathParameters: ["appID": app.id], headers: headers, requestID: "test")
                do {
                    _ = try await handler(request)
                    Issue.record("the failing handler answered")
                } catch let error as HTTPError {
                    #expect(error.status == status)
                    #expect(error.headers["RateLimit-Limit"] == "100" && error.headers["RateLimit-Remaining"] != nil,
                            "\(status): \(error.headers)")
                } catch {
                    Issue.record("\(status): \(error) reaches the server without the request's RateLimit headers")
                }
            }
        }
        await redis.close()
    }
}
