import Foundation
import HeraldAPNsCore
import HeraldCrypto
import HeraldRuntime
import HeraldTLS

/// An HTTP/2 APNs client with token (JWT) authentication.
///
/// One event-loop thread drives every connection: TLS 1.2+ with ALPN `h2` and full certificate and host-name
/// verification, requests multiplexed up to the server's SETTINGS_MAX_CONCURRENT_STREAMS, a pool of connections
/// per (provider key, endpoint), PING health checks, GOAWAY handling and reconnects with backoff. Provider tokens
/// are signed once per key and shared (see `APNsProviderTokenCache`).
///
/// Call `shutdown()` before dropping the client.
public final class APNsClient: Sendable {
    private let production: APNsEndpoint
    private let sandbox: APNsEndpoint
    let broadcastProduction: APNsEndpoint
    let broadcastSandbox: APNsEndpoint
    let manageProduction: APNsEndpoint
    let manageSandbox: APNsEndpoint
    private let requestTimeout: Duration
    private let loop: EventLoop
    private let core: ClientCore
    private let metrics: APNsMetrics
    let broadcastMetrics: BroadcastMetrics
    private let logger: Logger
    /// The provider-token cache this client signs with.
    public let providerTokens: APNsProviderTokenCache

    /// - Parameters:
    ///   - now: the wall clock used for provider tokens (injectable for tests).
    /// - Throws: `APNsError` `.invalidConfiguration` for a bad URL or an unreadable CA file.
    public init(configuration: APNsConfiguration = APNsConfiguration(), logger: Logger,
                metrics: MetricsRegistry = .shared, now: @escaping @Sendable () -> Date = { Date() }) throws(APNsError) {
        production = try APNsEndpoint(url: configuration.productionURL)
        sandbox = try APNsEndpoint(url: configuration.sandboxURL)
        broadcastProduction = try APNsEndpoint(url: configuration.broadcastProductionURL ?? configuration.productionURL)
        broadcastSandbox = try APNsEndpoint(url: configuration.broadcastSandboxURL ?? configuration.sandboxURL)
        manageProduction = try APNsEndpoint(url: configuration.manageProductionURL)
        manageSandbox = try APNsEndpoint(url: configuration.manageSandboxURL)
        broadcastMetrics = BroadcastMetrics(metrics)
        requestTimeout = configuration.requestTimeout
        self.logger = logger
        self.metrics = APNsMetrics(metrics)
        providerTokens = APNsProviderTokenCache(window: configuration.providerTokenWindow,
                                                minimumInterval: configuration.providerTokenMinimumInterval,
                                                now: now, metrics: metrics)
        // A peer that vanishes must surface as a write error, not kill the process: OpenSSL writes with write(2).
        signal(SIGPIPE, SIG_IGN)
        // The extra CA (the simulator's, a test APNs) is trusted only for the configured hosts that are not
        // Apple's: a certificate it signed for api.push.apple.com is refused.
        let systemTLS: TLSContext, extraTLS: TLSContext?
        do {
            systemTLS = try TLSContext.client(extraCAFile: nil)
            extraTLS = try configuration.extraCAFile.map { file throws(ConfigurationError) in
                try TLSContext.client(extraCAFile: file)
            }
        } catch {
            throw APNsError(.invalidConfiguration, error.message)
        }
        loop = try EventLoop(name: "herald-apns", tickInterval: .milliseconds(25))
        let core = ClientCore(configuration: configuration, loop: loop, systemTLS: systemTLS, extraTLS: extraTLS,
                              metrics: self.metrics, logger: logger)
        self.core = core
        loop.execute { [loop] in
            loop.afterBatch = { core.afterBatch() }
            loop.onRequest = { core.enqueue($0) }
            loop.onTick = { core.tick(now: $0) }
        }
    }

    deinit {
        loop.execute { [core] in core.beginShutdown(gracePeriod: .zero) }
    }

    /// Sends one notification and returns APNs' answer (any status; see `APNsResponse.disposition`).
    ///
    /// The request is checked locally first (payload size, collapse id, token format). A request the server did
    /// not process (REFUSED_STREAM, or above a GOAWAY's last-stream-id) is sent again on a usable connection, up
    /// to three attempts within the request timeout. On 403 ExpiredProviderToken the provider token is
    /// re-signed, when the 20-minute rule allows, and the request is sent once more.
    /// - Throws: `APNsError` when there is no answer (`isRetriable` says whether to try again), or
    ///   `CancellationError`.
    public func send(_ request: APNsRequest, credentials: APNsCredentials,
                     environment: APNsEnvironment) async throws -> APNsResponse {
        do {
            try request.validate()
        } catch {
            metrics.pushes.labels("error", error.kind).increment()
            throw error
        }
        let endpoint = environment == .production ? production : sandbox
        let token = try providerTokens.token(for: credentials)
        let response = try await perform(request, token: token, credentials: credentials, endpoint: endpoint)
        guard response.needsProviderTokenRefresh,
              let fresh = try providerTokens.token(afterRejecting: token, for: credentials) else { return response }
        logger.info("APNs refused the provider token as expired; retrying with a fresh one",
                    ["apns.key_id": credentials.keyID])
        return try await perform(request, token: fresh, credentials: credentials, endpoint: endpoint)
    }

    /// The HTTP/2 request `send(_:credentials:environment:)` would make, without sending it: its header fields in
    /// order, the provider token cut to its first 16 characters (it is a credential), and its body.
    public func preview(_ request: APNsRequest, credentials: APNsCredentials,
                        environment: APNsEnvironment) throws(APNsError) -> (headers: [(String, String)], body: [UInt8]) {
        try request.validate()
        let token = try providerTokens.token(for: credentials)
        let block = Self.headers(request, token: token.value, endpoint: environment == .production ? production : sandbox)
        return (Self.readable(block), request.payload)
    }

    /// A header block as name/value pairs, the provider token cut to its first 16 characters.
    static func readable(_ block: HeaderBlock) -> [(String, String)] {
        block.fields.map { field -> (String, String) in
            let name = String(decoding: block.bytes[field.nameStart..<field.nameStart + field.nameLength], as: UTF8.self)
            var value = String(decoding: block.bytes[field.valueStart..<field.valueStart + field.valueLength], as: UTF8.self)
            if name == "authorization" { value = String(value.prefix("bearer ".count + 16)) + "…" }
            return (name, value)
        }
    }

    /// Sends many notifications signed with one provider key; returns one outcome per request, in order.
    ///
    /// Each request is treated as `send(_:credentials:environment:)` treats it (local checks, transparent resend
    /// when not processed, one refresh and resend on 403 ExpiredProviderToken), but the whole batch costs one
    /// task suspension and one hand-over to the event loop instead of one per request: use it to fan one
    /// notification out to many devices. Requests beyond `maximumQueuedRequests` waiting in the pool fail as
    /// `.queueFull`, so keep batches well below it.
    /// - Throws: `CancellationError` only, when the calling task was cancelled (requests still in flight are
    ///   reset and the rest of the outcomes are dropped).
    public func send(_ requests: [APNsRequest], credentials: APNsCredentials,
                     environment: APNsEnvironment) async throws -> [Result<APNsResponse, APNsError>] {
        var results = [Result<APNsResponse, APNsError>?](repeating: nil, count: requests.count)
        var valid: [Int] = []
        valid.reserveCapacity(requests.count)
        for index in requests.indices {
            do {
                try requests[index].validate()
                valid.append(index)
            } catch {
                metrics.pushes.labels("error", error.kind).increment()
                results[index] = .failure(error)
            }
        }
        let endpoint = environment == .production ? production : sandbox
        do {
            guard !valid.isEmpty else { return results.map { $0! } }
            let token = try providerTokens.token(for: credentials)
            // All valid (the usual case): the requests as they are, not a copy of each.
            let allValid = valid.count == requests.count
            let outcomes = try await perform(allValid ? requests : valid.map { requests[$0] },
                                             token: token, credentials: credentials, endpoint: endpoint)
            let expired = zip(valid, outcomes).compactMap { position, outcome -> Int? in
                if case .success(let response) = outcome, response.needsProviderTokenRefresh { position } else { nil }
            }
            if allValid, expired.isEmpty { return outcomes }
            for (position, outcome) in zip(valid, outcomes) { results[position] = outcome }
            if !expired.isEmpty, let fresh = try providerTokens.token(afterRejecting: token, for: credentials) {
                logger.info("APNs refused the provider token as expired; retrying with a fresh one",
                            ["apns.key_id": credentials.keyID, "apns.requests": String(expired.count)])
                let retried = try await perform(expired.map { requests[$0] }, token: fresh, credentials: credentials,
                                                endpoint: endpoint)
                for (position, outcome) in zip(expired, retried) { results[position] = outcome }
            }
        } catch let error as APNsError {
            // Only signing the provider token throws APNsError here: nothing of what is left was sent.
            for index in results.indices where results[index] == nil { results[index] = .failure(error) }
        }
        return results.map { $0! }
    }

    private func perform(_ request: APNsRequest, token: APNsProviderTokenCache.Token, credentials: APNsCredentials,
                         endpoint: APNsEndpoint) async throws -> APNsResponse {
        let started = ContinuousClock.now
        let raw: RawResponse
        do {
            raw = try await perform(Self.headers(request, token: token.value, endpoint: endpoint), body: request.payload,
                                    poolKey: PoolKey(credentials, endpoint: endpoint))
        } catch let error as APNsError {
            metrics.pushes.labels("error", error.kind).increment()
            throw error
        }
        metrics.latency.observe(since: started)
        return response(raw)
    }

    /// One request on its own: one hand-over to the loop, one suspension.
    func perform(_ headers: HeaderBlock, body: [UInt8], poolKey: PoolKey,
                 successBodyLimit: Int = 0) async throws -> RawResponse {
        let pending = PendingRequest(headers: headers, body: body, deadline: .now + requestTimeout, poolKey: poolKey,
                                     successBodyLimit: successBodyLimit)
        metrics.inFlight.add(1)
        defer { metrics.inFlight.add(-1) }
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { continuation in
                pending.completion = .single(continuation)
                if !loop.submit(pending) {
                    pending.completion = nil
                    continuation.resume(throwing: APNsError(.shutdown, "the APNs client was shut down"))
                }
            }
        } onCancel: { [loop, core] in
            loop.execute { core.cancel(pending) }
        }
    }

    /// One hand-over to the loop and one suspension for the whole batch.
    private func perform(_ requests: [APNsRequest], token: APNsProviderTokenCache.Token,
                         credentials: APNsCredentials,
                         endpoint: APNsEndpoint) async throws -> [Result<APNsResponse, APNsError>] {
        let started = ContinuousClock.now
        let deadline = started + requestTimeout
        let poolKey = PoolKey(credentials, endpoint: endpoint)
        let batch = BatchCompletion(count: requests.count)
        let pending = requests.indices.map { index in
            let pending = PendingRequest(headers: Self.headers(requests[index], token: token.value, endpoint: endpoint),
                                         body: requests[index].payload, deadline: deadline, poolKey: poolKey)
            pending.completion = .batch(batch, index: index)
            return pending
        }
        metrics.inFlight.add(Int64(pending.count))
        defer { metrics.inFlight.add(-Int64(pending.count)) }
        let raws = await withTaskCancellationHandler {
            await withUnsafeContinuation { continuation in
                batch.continuation = continuation
                if !loop.submit(pending) {
                    // The loop never saw them: resolving here resumes the continuation once the last one is done.
                    for request in pending { request.fail(.shutdown, "the APNs client was shut down") }
                }
            }
        } onCancel: { [loop, core] in
            loop.execute { for request in pending { core.cancel(request) } }
        }
        // Answered together: one latency for the batch, observed once per request under one lock.
        let elapsed = Histogram.seconds(since: started)
        metrics.latency.observe(elapsed, count: UInt64(raws.count(where: { if case .success = $0 { true } else { false } })))
        return try raws.map { raw throws -> Result<APNsResponse, APNsError> in
            switch raw {
            case .success(let raw):
                return .success(response(raw))
            case .failure(let error as APNsError):
                metrics.pushes.labels("error", error.kind).increment()
                return .failure(error)
            case .failure(let error):
                throw error
            }
        }
    }

    private func response(_ raw: RawResponse) -> APNsResponse {
        if raw.status == 200 {
            metrics.delivered.increment()
            var response = APNsResponse(status: 200, apnsID: raw.apnsID, reason: nil, timestamp: nil)
            response.uniqueID = raw.uniqueID
            return response
        }
        var response = APNsResponse(status: raw.status, apnsID: raw.apnsID, body: raw.body)
        response.uniqueID = raw.uniqueID
        metrics.pushes.labels(String(raw.status), response.reason?.metricLabel ?? "").increment()
        return response
    }

    private static func headers(_ request: APNsRequest, token: String, endpoint: APNsEndpoint) -> HeaderBlock {
        // Names, fixed values and the longest numbers fit in 256 bytes; the rest is counted.
        let capacity = 256 + endpoint.authority.utf8.count + request.deviceToken.utf8.count + token.utf8.count
            + request.topic.utf8.count + (request.collapseID?.utf8.count ?? 0)
        return HeaderBlock(capacity: capacity) { headers in
            headers.add(":method", "POST")
            headers.add(":scheme", "https")
            headers.add(":authority", endpoint.authority)
            headers.add(":path", "/3/device/", request.deviceToken, lowercased: true)
            headers.add("authorization", "bearer ", token)
            headers.add("apns-push-type", request.pushType.rawValue)
            headers.add("apns-topic", request.topic)
            headers.add("apns-priority", request.effectivePriority.rawValue)
            if let expiration = request.expiration {
                headers.add("apns-expiration", Int(max(0, expiration.timeIntervalSince1970.rounded(.down))))
            }
            if let collapseID = request.collapseID { headers.add("apns-collapse-id", collapseID) }
            if let apnsID = request.apnsID { headers.add("apns-id", apnsID) }
            headers.add("content-length", request.payload.count)
        }
    }

    /// Lets in-flight requests finish for up to `gracePeriod`, fails queued and remaining ones with `.shutdown`,
    /// sends GOAWAY on every connection and stops the event loop. Later sends fail with `.shutdown`.
    public func shutdown(gracePeriod: Duration = .seconds(5)) async {
        loop.execute { [core] in core.beginShutdown(gracePeriod: gracePeriod) }
        await loop.waitUntilFinished()
    }

    /// The pool's connections as the loop sees them now.
    public func connections() async -> [APNsConnectionInfo] {
        await withCheckedContinuation { continuation in
            let core = core
            if !loop.execute({ continuation.resume(returning: core.snapshot()) }) { continuation.resume(returning: []) }
        }
    }
}
