import Foundation
import HeraldCore
import HeraldCrypto
import HeraldHTTP
import HeraldRuntime
import HeraldStore

/// Who may call what: API-key or OAuth authentication, app scoping, key kinds, and the rate limits (see
/// `RateLimiter`: a public key counts per device token, within an app-wide ceiling).
struct Gatekeeper: Sendable {
    enum Audience: Sendable {
        /// Device endpoints: a public or secret key.
        case device
        /// Device endpoints that are about no one device (a post's broadcast channel): a public or secret key; a
        /// public key's requests count in its app-wide ceiling only.
        case everyDevice
        /// Producer endpoints: a secret key only.
        case producer
    }

    /// A request that got in: its app, its caller, and the rate-limit headers every response must carry.
    struct Admission: Sendable {
        var app: App
        var principal: Principal
        var headers: [String: String]
    }

    let apps: AppRegistry
    let limiter: RateLimiter
    let clockSkew: Duration
    let logger: Logger
    let rateLimited = MetricsRegistry.shared.counter("herald_ingest_rate_limited_total",
                                                      help: "Requests refused with 429.")

    /// Wraps an endpoint: admits the request, runs `body`, and puts the rate-limit headers on whatever it
    /// answers, errors included. `device` reads the device token a request is about (what a public key's
    /// request counts for; nil when it names none or a bad one).
    func endpoint(_ audience: Audience, appFromPath: Bool = true, oauth: Bool = false,
                  device: @escaping @Sendable (HTTPRequest) -> String? = { _ in nil },
                  _ body: @escaping @Sendable (HTTPRequest, Admission) async throws -> HTTPResponse) -> HTTPHandler {
        { request in
            let admission = try await admit(request, audience: audience,
                                            appID: appFromPath ? try request.pathParameter("appID") : nil, oauth: oauth,
                                            device: device)
            do {
                var response = try await body(request, admission)
                for (name, value) in admission.headers { response.headers[name] = value }
                return response
            } catch {
                throw counted(error, headers: admission.headers, request: request)
            }
        }
    }

    /// A request's rate-limit window, for a handler that counts the request in the Redis call doing its work.
    ///
    /// Without a lock (one per request was two allocations and a mutex on the hot path): a meter belongs to one
    /// request's task, which records into it inside the handler and reads it only after the handler returned.
    final class Meter: @unchecked Sendable { // used by one task, in sequence: record in the handler, read after it
        private let limiter: RateLimiter
        private let principal: Principal
        private let app: String
        /// What counting the request decided, once it has been counted.
        private(set) var decision: RateLimiter.Decision?
        /// The window the handler was given to count in: a call that failed after it may have counted the request.
        private(set) var handedOut: RateLimiter.Window?

        init(limiter: RateLimiter, principal: Principal, app: String) {
            (self.limiter, self.principal, self.app) = (limiter, principal, app)
        }

        /// The window to count the request in, for the device token it is about (its counter in `slot`).
        func window(device: String?, in slot: RedisKeys.DeviceCounterSlot = .deviceToken) -> RateLimiter.Window {
            let window = limiter.window(for: principal.rateLimitKey, device: Gatekeeper.rateLimitDevice(principal, device),
                                        in: slot, app: app)
            handedOut = window
            return window
        }

        func record(_ decision: RateLimiter.Decision) { self.decision = decision }
    }

    /// The device a request counts for: for a public key its device token ("-" when the request names none or a
    /// bad one, so those share one window per key), nil for a credential of one caller.
    static func rateLimitDevice(_ principal: Principal, _ device: String?) -> String? {
        principal.isSharedByDevices ? device ?? "-" : nil
    }

    /// Like `endpoint`, for a handler that counts its request itself, in the Redis call that does its work (one
    /// round trip instead of two): it counts in `meter.window(device:)`, then records an allowed decision with
    /// `meter.record(_:)` or throws `refuse(_:_:)` for a refused one. A request whose handler fails before counting
    /// (bad input) is counted here instead, so every admitted request counts once and over the limit 429 wins over
    /// any other answer, as with `endpoint`: in the window of the valid device token `device` finds in the request,
    /// if any (its counter in `deviceSlot`). `admission.headers` is empty: the wrapper adds them to the answer.
    func selfCountingEndpoint(_ audience: Audience, appFromPath: Bool = true, oauth: Bool = false,
                              device: @escaping @Sendable (HTTPRequest) -> String? = { _ in nil },
                              deviceSlot: RedisKeys.DeviceCounterSlot = .deviceToken,
                              _ body: @escaping @Sendable (HTTPRequest, Admission, Meter) async throws -> HTTPResponse)
        -> HTTPHandler {
        { request in
            let (app, principal) = try identify(request, audience: audience,
                                                appID: appFromPath ? try request.pathParameter("appID") : nil,
                                                oauth: oauth)
            let meter = Meter(limiter: limiter, principal: principal, app: app.id)
            let admission = Admission(app: app, principal: principal, headers: [:])
            do {
                var response = try await body(request, admission, meter)
                let decision = try await decision(of: meter, device: device(request), in: deviceSlot)
                Self.setHeaders(decision, on: &response.headers)
                return response
            } catch {
                let mapped = Failures.http(error, logger: logger)
                if mapped is CancellationError { throw mapped }
                // After a 503 Redis is failing: counting now would only wait for the same deadline again. A request
                // the handler already counted still says where its window stands; one whose counting call failed
                // after it may have counted (a script's error past its count) is read, not counted a second time.
                let decision: RateLimiter.Decision?
                if let recorded = meter.decision {
                    decision = recorded
                } else if (mapped as? HTTPError)?.status == 503 {
                    decision = nil
                } else if let window = meter.handedOut {
                    decision = try? await limiter.standing(window)
                } else {
                    decision = try await self.decision(of: meter, device: device(request), in: deviceSlot)
                }
                throw counted(mapped, headers: decision.map(Self.headers) ?? [:], request: request)
            }
        }
    }

    /// `error` as the answer to a counted request, carrying its `RateLimit-*` `headers`: an unexpected failure
    /// becomes here the 500 it would have become anyway (and is logged here), so that it carries them too.
    private func counted(_ error: any Error, headers: [String: String], request: HTTPRequest) -> any Error {
        switch Failures.http(error, logger: logger) {
        case var failure as HTTPError:
            failure.headers.merge(headers) { old, _ in old }
            return failure
        case let cancellation as CancellationError:
            return cancellation
        case let unexpected:
            logger.error("handler failed", ["http.route": request.route, "http.request_id": request.requestID,
                                            "error": "\(unexpected)"])
            var failure = HTTPError.internalError
            failure.headers = headers
            return failure
        }
    }

    /// Records a refused decision and returns the 429 to throw.
    func refuse(_ meter: Meter, _ decision: RateLimiter.Decision) -> HTTPError {
        meter.record(decision)
        return refusal(decision)
    }

    /// The meter's decision, counting the request now if the handler did not; throws the 429 past the limit.
    private func decision(of meter: Meter, device: @autoclosure () -> String?,
                          in slot: RedisKeys.DeviceCounterSlot) async throws -> RateLimiter.Decision {
        if let decision = meter.decision { return decision }
        let window = meter.window(device: device(), in: slot)
        let decision = try await Failures.mapping(logger) { try await limiter.hit(window) }
        guard decision.allowed else { throw refuse(meter, decision) }
        meter.record(decision)
        return decision
    }

    func admit(_ request: HTTPRequest, audience: Audience, appID: String?, oauth: Bool,
               device: (HTTPRequest) -> String?) async throws -> Admission {
        let (app, principal) = try identify(request, audience: audience, appID: appID, oauth: oauth)
        let window = audience == .everyDevice && principal.isSharedByDevices
            ? limiter.ceilingWindow(for: principal.rateLimitKey, app: app.id)
            : limiter.window(for: principal.rateLimitKey,
                             device: Self.rateLimitDevice(principal,
                                                          principal.isSharedByDevices ? device(request) : nil),
                             app: app.id)
        let decision = try await Failures.mapping(logger) { try await limiter.hit(window) }
        guard decision.allowed else { throw refusal(decision) }
        return Admission(app: app, principal: principal, headers: Self.headers(decision))
    }

    /// Authentication, app scoping and key kind: everything about the caller but the rate limit.
    private func identify(_ request: HTTPRequest, audience: Audience, appID: String?,
                          oauth: Bool) throws(HTTPError) -> (App, Principal) {
        let (app, principal) = try authenticate(request, directory: apps.directory, appID: appID, oauth: oauth)
        if audience == .producer, principal.kind != .secret {
            throw HTTPError(status: 403, code: "forbidden", message: "this endpoint takes a secret key")
        }
        return (app, principal)
    }

    /// `headers(_:)` added to a handler's response directly, without building a dictionary first or searching the
    /// response's headers (every request of the hot endpoints): handlers never set `RateLimit-*` themselves.
    static func setHeaders(_ decision: RateLimiter.Decision, on headers: inout HTTPHeaders) {
        headers.add("RateLimit-Limit", String(decision.limit))
        headers.add("RateLimit-Remaining", String(decision.remaining))
        headers.add("RateLimit-Reset", String(decision.resetSeconds))
    }

    /// `RateLimit-*`: on every response to a counted request.
    static func headers(_ decision: RateLimiter.Decision) -> [String: String] {
        ["RateLimit-Limit": String(decision.limit), "RateLimit-Remaining": String(decision.remaining),
         "RateLimit-Reset": String(decision.resetSeconds)]
    }

    /// The 429 for a request over the limit.
    private func refusal(_ decision: RateLimiter.Decision) -> HTTPError {
        rateLimited.increment()
        var headers = Self.headers(decision)
        headers["Retry-After"] = String(decision.resetSeconds)
        return HTTPError(status: 429, code: "rate_limited",
                         message: "more than \(decision.limit) requests this minute; retry in \(decision.resetSeconds) s",
                         headers: headers)
    }

    private func authenticate(_ request: HTTPRequest, directory: AppDirectory, appID: String?,
                              oauth: Bool) throws(HTTPError) -> (App, Principal) {
        guard let credential = Self.credential(request) else {
            throw HTTPError(status: 401, code: "unauthorized", message: "send an API key in X-API-Key or Authorization: Bearer")
        }
        if oauth, credential.bearer, credential.value.split(separator: ".", omittingEmptySubsequences: false).count == 3 {
            return try authenticateOAuth(credential.value, directory: directory, appID: appID)
        }
        guard let principal = directory.authenticate(apiKey: credential.value),
              let app = directory.apps[principal.appID] else {
            throw HTTPError(status: 401, code: "unauthorized", message: "the API key is not valid")
        }
        // The same answer whether or not the app exists: a key says nothing about other apps.
        if let appID, appID != principal.appID { throw Self.otherApp(appID, "key") }
        return (app, principal)
    }

    /// An OAuth 2 access token (`AccessToken` checks it), its refusals as the API renders them.
    private func authenticateOAuth(_ token: String, directory: AppDirectory,
                                   appID: String?) throws(HTTPError) -> (App, Principal) {
        let access: AccessToken
        do {
            access = try AccessToken(verifying: token, directory: directory, appID: appID,
                                     now: Date().timeIntervalSince1970, skew: Double(clockSkew.components.seconds))
        } catch {
            switch error {
            case .invalid(let why):
                throw HTTPError(status: 401, code: "invalid_token", message: "the access token is not valid: \(why)",
                                headers: ["WWW-Authenticate": "Bearer error=\"invalid_token\""])
            case .otherApp(let id):
                throw Self.otherApp(id, "token")
            case .insufficientScope:
                let scope = AccessToken.activitiesScope
                throw HTTPError(status: 403, code: "insufficient_scope", message: "the token lacks the \(scope) scope",
                                headers: ["WWW-Authenticate": "Bearer error=\"insufficient_scope\", scope=\"\(scope)\""])
            }
        }
        let principal = Principal(appID: access.app.id, kind: .public, user: access.subject,
                                  rateLimitKey: "oauth:" + Hex.encode(SHA256.hash(access.app.id + "\n" + access.subject)))
        return (access.app, principal)
    }

    private static func otherApp(_ id: String, _ credential: String) -> HTTPError {
        HTTPError(status: 403, code: "forbidden", message: "the \(credential) does not belong to app \(id)")
    }

    private static func credential(_ request: HTTPRequest) -> (value: String, bearer: Bool)? {
        if let key = request.headers["X-API-Key"], !key.isEmpty { return (key, false) }
        guard let authorization = request.headers["Authorization"] else { return nil }
        let parts = authorization.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return nil }
        let value = parts[1].trimmingCharacters(in: .whitespaces)
        return value.isEmpty ? nil : (value, true)
    }
}
