import Foundation
import HeraldAPNs
import HeraldCrypto
import HeraldRuntime
import Testing

@Suite struct APNsRequestValidationTests {
    private func problem(_ request: APNsRequest) -> APNsRequestProblem? {
        do {
            try request.validate()
            return nil
        } catch {
            guard case .invalidRequest(let problem) = error.code else { return nil }
            #expect(!error.isRetriable)
            return problem
        }
    }

    @Test func payloadLimitsDependOnPushType() {
        var request = Fixtures.request()
        request.payload = [UInt8](repeating: 0x20, count: 4096)
        #expect(problem(request) == nil)
        request.payload.append(0x20)
        #expect(problem(request) == .payloadTooLarge(size: 4097, limit: 4096))
        request.pushType = .voip
        #expect(problem(request) == nil)
        request.payload = [UInt8](repeating: 0x20, count: 5121)
        #expect(problem(request) == .payloadTooLarge(size: 5121, limit: 5120))
        request.payload = []
        #expect(problem(request) == .payloadEmpty)
    }

    @Test func collapseIDIsAtMost64Bytes() {
        var request = Fixtures.request()
        request.collapseID = String(repeating: "c", count: 64)
        #expect(problem(request) == nil)
        request.collapseID = String(repeating: "c", count: 65)
        #expect(problem(request) == .collapseIDTooLong(size: 65))
        // Bytes, not characters: 22 × "é" (2 bytes each) + 21 ASCII = 65 bytes.
        request.collapseID = String(repeating: "é", count: 22) + String(repeating: "c", count: 21)
        #expect(problem(request) == .collapseIDTooLong(size: 65))
        request.collapseID = "a\r\nb"
        #expect(problem(request) == .invalidCollapseID)
    }

    @Test func deviceTokenAndTopicAreChecked() {
        #expect(problem(Fixtures.request(token: "")) == .invalidDeviceToken)
        #expect(problem(Fixtures.request(token: "abc/../x")) == .invalidDeviceToken)
        #expect(problem(Fixtures.request(token: "ABCDEF0123")) == nil)
        var request = Fixtures.request()
        request.topic = ""
        #expect(problem(request) == .invalidTopic)
        request.topic = "com.example\napns-priority: 1"
        #expect(problem(request) == .invalidTopic)
    }

    @Test func priorityDefaultsToTenAndFiveForBackground() {
        var request = Fixtures.request()
        #expect(request.effectivePriority == .immediate)
        request.pushType = .background
        #expect(request.effectivePriority == .powerConsiderate)
        request.priority = .low
        #expect(request.effectivePriority == .low)
    }

    @Test func invalidRequestsFailLocallyWithoutConnecting() async throws {
        // Nothing listens on this port: a network attempt would fail as connectionFailed, not invalidRequest.
        let client = try APNsClient(configuration: Fixtures.configuration(port: 20329), logger: Fixtures.logger,
                                    metrics: MetricsRegistry())
        var oversize = Fixtures.request()
        oversize.payload = [UInt8](repeating: 0x20, count: 4097)
        var longCollapse = Fixtures.request()
        longCollapse.collapseID = String(repeating: "x", count: 65)
        for request in [oversize, longCollapse] {
            await #expect {
                _ = try await client.send(request, credentials: Fixtures.credentials, environment: .production)
            } throws: { error in
                guard let error = error as? APNsError, case .invalidRequest = error.code else { return false }
                return true
            }
        }
        #expect(await client.connections().isEmpty)
        await client.shutdown()
    }

    @Test func endpointURLsAreParsed() throws {
        #expect(try APNsEndpoint(url: "https://api.push.apple.com") == APNsEndpoint(host: "api.push.apple.com", port: 443))
        #expect(try APNsEndpoint(url: "https://localhost:2197/") == APNsEndpoint(host: "localhost", port: 2197))
        #expect(try APNsEndpoint(url: "https://[::1]:8443").authority == "[::1]:8443")
        #expect(throws: APNsError.self) { try APNsEndpoint(url: "http://localhost:80") }
        #expect(throws: APNsError.self) { try APNsEndpoint(url: "https://localhost:notaport") }
    }

    @Test func unreadableCAFileIsAConfigurationError() {
        var configuration = APNsConfiguration()
        configuration.extraCAFile = "/nonexistent/ca.pem"
        #expect {
            _ = try APNsClient(configuration: configuration, logger: Fixtures.logger, metrics: MetricsRegistry())
        } throws: { error in
            (error as? APNsError)?.code == .invalidConfiguration
        }
    }
}

@Suite struct APNsResponseClassificationTests {
    /// Apple's documented status/reason pairs and what each means for the caller.
    static let documented: [(Int, String, APNsDisposition)] = [
        (400, "BadCollapseId", .permanent), (400, "BadDeviceToken", .removeToken),
        (400, "BadExpirationDate", .permanent), (400, "BadMessageId", .permanent), (400, "BadPriority", .permanent),
        (400, "BadTopic", .permanent), (400, "DeviceTokenNotForTopic", .removeToken),
        (400, "DuplicateHeaders", .permanent), (400, "IdleTimeout", .retry), (400, "InvalidPushType", .permanent),
        (400, "MissingDeviceToken", .permanent), (400, "MissingTopic", .permanent), (400, "PayloadEmpty", .permanent),
        (400, "TopicDisallowed", .permanent), (403, "BadCertificate", .permanent),
        (403, "BadCertificateEnvironment", .permanent), (403, "ExpiredProviderToken", .refreshProviderToken),
        (403, "Forbidden", .permanent), (403, "InvalidProviderToken", .permanent),
        (403, "MissingProviderToken", .permanent), (403, "UnrelatedKeyIdInToken", .permanent),
        (403, "BadEnvironmentKeyInToken", .permanent), (404, "BadPath", .permanent),
        (405, "MethodNotAllowed", .permanent), (410, "Unregistered", .removeToken), (410, "ExpiredToken", .removeToken),
        (413, "PayloadTooLarge", .permanent), (429, "TooManyProviderTokenUpdates", .retry),
        (429, "TooManyRequests", .retry), (500, "InternalServerError", .retry), (503, "ServiceUnavailable", .retry),
        (503, "Shutdown", .retry),
        // Broadcast channels (iOS 18): management and publishing.
        (400, "BadChannelId", .permanent), (400, "BadRequestParams", .permanent), (400, "BadRequestPayload", .permanent),
        (400, "CannotCreateChannelConfig", .permanent), (400, "ChannelNotRegistered", .permanent),
        (400, "FeatureNotEnabled", .permanent), (400, "MissingChannelId", .permanent),
        (400, "MissingPushType", .permanent), (403, "TopicMismatch", .permanent),
    ]

    @Test func documentedPairsAreClassified() {
        for (status, reasonText, expected) in Self.documented {
            let reason = APNsReason(reasonText)
            #expect(reason.description == reasonText)
            if case .unknown = reason { Issue.record("\(reasonText) is not a known reason") }
            let body = Array(#"{"reason":"\#(reasonText)"}"#.utf8)
            let response = APNsResponse(status: status, apnsID: nil, body: body)
            #expect(response.reason == reason)
            #expect(response.disposition == expected, "\(status) \(reasonText)")
            #expect(response.isRetriable == (expected == .retry))
            #expect(response.isTokenInvalid == (expected == .removeToken))
            #expect(response.needsProviderTokenRefresh == (expected == .refreshProviderToken))
        }
        #expect(Set(Self.documented.map { APNsReason($0.1) }) == Set(APNsReason.allKnown))
    }

    @Test func successAndUnknownReasons() {
        let ok = APNsResponse(status: 200, apnsID: "6b0c9f1e-1234-4cde-8f00-0123456789ab", body: [])
        #expect(ok.isDelivered && ok.reason == nil && !ok.isRetriable)
        let odd = APNsResponse(status: 400, apnsID: nil, body: Array(#"{"reason":"SomethingNew"}"#.utf8))
        #expect(odd.reason == .unknown("SomethingNew") && odd.disposition == .permanent)
        #expect(odd.reason?.metricLabel == "other" && APNsReason.badDeviceToken.metricLabel == "BadDeviceToken")
        let notJSON = APNsResponse(status: 500, apnsID: nil, body: Array("<html>".utf8))
        #expect(notJSON.reason == nil && notJSON.isRetriable)
    }

    @Test func unregisteredCarriesTheTimestamp() {
        let body = Array(#"{"reason":"Unregistered","timestamp":1700000000123}"#.utf8)
        let response = APNsResponse(status: 410, apnsID: nil, body: body)
        #expect(response.isTokenInvalid)
        #expect(response.timestamp == Date(timeIntervalSince1970: 1_700_000_000.123))
    }

    @Test func aTimestampNoClockCouldShowIsDropped() {
        for odd in ["1e300", "-5", "253402300800000"] {
            let body = Array(#"{"reason":"Unregistered","timestamp":\#(odd)}"#.utf8)
            let response = APNsResponse(status: 410, apnsID: nil, body: body)
            #expect(response.isTokenInvalid, "\(odd)")
            #expect(response.timestamp == nil, "\(odd)")
        }
    }

    @Test func errorsSayWhetherToRetry() {
        let retriable: [APNsError.Code] = [.timeout, .connectionFailed, .notProcessed, .protocolError, .queueFull, .shutdown]
        let permanent: [APNsError.Code] = [.invalidRequest(.payloadEmpty), .tlsFailure, .http2NotNegotiated,
                                           .providerTokenFailure, .invalidConfiguration]
        for code in retriable { #expect(APNsError(code, "").isRetriable) }
        for code in permanent { #expect(!APNsError(code, "").isRetriable) }
    }
}

@Suite struct APNsProviderTokenTests {
    @Test func tokenHasTheAPNsShapeAndVerifies() throws {
        let clock = TestClock()
        let cache = APNsProviderTokenCache(now: { clock.now }, metrics: MetricsRegistry())
        let token = try cache.token(for: Fixtures.credentials)
        let jwt = try JSONWebToken(parsing: token.value)
        #expect(jwt.header == ["alg": .string("ES256"), "kid": .string("KEY1234567")])
        // The clock is on a window's start: the token is the previous window's until a minute has passed.
        #expect(jwt.claims == ["iss": .string("TEAM123456"), "iat": .number(1_800_000_000 - 1800)])
        // iat is a JSON number, not a string.
        let claimsText = String(decoding: Base64URL.decode(token.value.split(separator: ".")[1])!, as: UTF8.self)
        #expect(claimsText.contains("\"iat\":1799998200"))
        #expect(jwt.signature.count == 64)
        try jwt.verify(with: Fixtures.credentials.privateKey.publicKey)
    }

    /// Two caches stand for two dispatcher pods signing with one key: they compute the same token, used for a
    /// whole 30-minute window and replaced once the next window is a minute old, with `iat` at the window's start.
    @Test func everyProcessSigningWithTheKeyUsesTheSameTokenForAWindow() throws {
        let clock = TestClock()
        clock.advance(by: 120) // two minutes into the window starting at 1_800_000_000
        let metrics = MetricsRegistry()
        let cache = APNsProviderTokenCache(now: { clock.now }, metrics: metrics)
        let otherPod = APNsProviderTokenCache(now: { clock.now }, metrics: MetricsRegistry())
        let first = try cache.token(for: Fixtures.credentials)
        #expect(first.issuedAt == Date(timeIntervalSince1970: 1_800_000_000))
        #expect(try otherPod.token(for: Fixtures.credentials) == first, "the same token, signed on its own")
        clock.advance(by: 28 * 60) // 30 minutes in: the next window starts, but is taken a minute later
        #expect(try cache.token(for: Fixtures.credentials) == first)
        clock.advance(by: 59)
        #expect(try cache.token(for: Fixtures.credentials) == first)
        clock.advance(by: 2)
        let second = try cache.token(for: Fixtures.credentials)
        #expect(second.issuedAt == Date(timeIntervalSince1970: 1_800_001_800) && second != first)
        #expect(try otherPod.token(for: Fixtures.credentials) == second)
        #expect(metrics.counter("herald_apns_provider_token_refreshes_total", help: "").labels().current == 2)
        // Another key has its own token.
        let other = APNsCredentials(teamID: "TEAM123456", keyID: "OTHERKEY12", privateKey: try PrivateKey.generateP256())
        #expect(try cache.token(for: other) != second)
    }

    /// A `.p8` replaced under the same team and key id (an apps-file reload) gets a token of its own at once,
    /// signed by the new key: the cache is keyed by the key's fingerprint too.
    @Test func aReplacedKeyUnderTheSameIdsGetsItsOwnToken() throws {
        let clock = TestClock()
        let cache = APNsProviderTokenCache(now: { clock.now }, metrics: MetricsRegistry())
        let old = try cache.token(for: Fixtures.credentials)
        let replacement = APNsCredentials(teamID: Fixtures.credentials.teamID, keyID: Fixtures.credentials.keyID,
                                          privateKey: try PrivateKey.generateP256())
        #expect(replacement.privateKey.fingerprint != Fixtures.credentials.privateKey.fingerprint)
        let new = try cache.token(for: replacement)
        #expect(new != old)
        try JSONWebToken(parsing: new.value).verify(with: replacement.privateKey.publicKey)
        #expect(throws: JSONWebToken.Failure.self) {
            try JSONWebToken(parsing: new.value).verify(with: Fixtures.credentials.privateKey.publicKey)
        }
        #expect(try cache.token(for: Fixtures.credentials) == old)
        let same = try PrivateKey(pem: Fixtures.credentials.privateKey.pem)
        #expect(same.fingerprint == Fixtures.credentials.privateKey.fingerprint, "the fingerprint is the key's, not the load's")
    }

    @Test func expiredProviderTokenRefreshesOnlyAfterTheMinimumInterval() throws {
        let clock = TestClock()
        clock.advance(by: 60) // the window's token is a minute old
        let cache = APNsProviderTokenCache(now: { clock.now }, metrics: MetricsRegistry())
        let first = try cache.token(for: Fixtures.credentials)
        clock.advance(by: 5 * 60)
        #expect(try cache.token(afterRejecting: first, for: Fixtures.credentials) == nil)
        clock.advance(by: 16 * 60)
        let second = try #require(try cache.token(afterRejecting: first, for: Fixtures.credentials))
        #expect(second != first)
        // A second request rejected with the old token gets the new one, without another signature.
        #expect(try cache.token(afterRejecting: first, for: Fixtures.credentials) == second)
        #expect(try cache.token(for: Fixtures.credentials) == second)
        // Signed 22 minutes into its window, issued at 20 (the five-minute grid): the next window starts 10
        // minutes after it, so the token is kept through that window (APNs compares issue times: a token issued
        // sooner after it would be one update too many) and replaced by the one after's.
        #expect(second.issuedAt == Date(timeIntervalSince1970: 1_800_000_000 + 20 * 60))
        clock.advance(by: 19 * 60 + 60)
        #expect(try cache.token(for: Fixtures.credentials) == second)
        clock.advance(by: 18 * 60)
        #expect(try cache.token(for: Fixtures.credentials) == second)
        clock.advance(by: 60)
        #expect(try cache.token(for: Fixtures.credentials).issuedAt == Date(timeIntervalSince1970: 1_800_003_600))
    }

    /// APNs refuses a token an hour old: a re-signed token kept past its window is still replaced in time.
    @Test func aKeptTokenIsReplacedBeforeItIsAnHourOld() throws {
        let clock = TestClock()
        let window: TimeInterval = 58 * 60
        let windowStart = ((clock.now.timeIntervalSince1970 / window).rounded(.down) + 1) * window // on the epoch
        func at(_ seconds: TimeInterval) { clock.advance(by: windowStart + seconds - clock.now.timeIntervalSince1970) }
        let cache = APNsProviderTokenCache(window: .seconds(window), now: { clock.now }, metrics: MetricsRegistry())
        at(60)
        let first = try cache.token(for: Fixtures.credentials)
        at(41 * 60)
        let second = try #require(try cache.token(afterRejecting: first, for: Fixtures.credentials))
        let issued = second.issuedAt.timeIntervalSince1970 - windowStart
        #expect(window - issued < 20 * 60, "the next window starts under 20 minutes after `second`")
        at(window + 60) // the next window is a minute old: `second` is kept
        #expect(try cache.token(for: Fixtures.credentials) == second)
        at(issued + 55 * 60 - 1)
        #expect(try cache.token(for: Fixtures.credentials) == second)
        at(issued + 55 * 60) // `second` is 55 minutes old
        let third = try cache.token(for: Fixtures.credentials)
        // Still issued 20 minutes after `second` (the window's start alone would be 19 minutes after it).
        #expect(third.issuedAt.timeIntervalSince(second.issuedAt) >= 20 * 60)
        #expect(third.issuedAt == Date(timeIntervalSince1970: max(windowStart + window, issued + windowStart + 20 * 60)))
        #expect(try cache.token(for: Fixtures.credentials) == third, "a window's own token is not signed again")
    }

    /// Pods refused the same token a few seconds apart sign the same new one, as they share the window's.
    @Test func podsRefusedTogetherSignTheSameToken() throws {
        let clock = TestClock(), otherClock = TestClock()
        clock.advance(by: 60)
        let cache = APNsProviderTokenCache(now: { clock.now }, metrics: MetricsRegistry())
        let otherPod = APNsProviderTokenCache(now: { otherClock.now }, metrics: MetricsRegistry())
        let shared = try cache.token(for: Fixtures.credentials)
        otherClock.advance(by: 61)
        #expect(try otherPod.token(for: Fixtures.credentials) == shared)
        clock.advance(by: 21 * 60 + 1)
        otherClock.advance(by: 21 * 60 + 4)
        let fresh = try #require(try cache.token(afterRejecting: shared, for: Fixtures.credentials))
        #expect(try otherPod.token(afterRejecting: shared, for: Fixtures.credentials) == fresh)
        #expect(fresh.issuedAt == Date(timeIntervalSince1970: 1_800_000_000 + 20 * 60))
    }

    /// A token signed after a rejection is issued a minute back at least, as a window's is: a pod whose clock is a
    /// little ahead of Apple's never sends an `iat` from the future.
    @Test func aTokenSignedAfterARejectionIsNeverIssuedInTheLastMinute() throws {
        let clock = TestClock()
        clock.advance(by: 60)
        let cache = APNsProviderTokenCache(now: { clock.now }, metrics: MetricsRegistry())
        let first = try cache.token(for: Fixtures.credentials) // issued at the window's start
        clock.advance(by: 19 * 60 + 30) // 20 minutes and 30 s after `first`'s iat, on the five-minute grid's 20
        #expect(try cache.token(afterRejecting: first, for: Fixtures.credentials) == nil, "its iat would be 30 s ago")
        clock.advance(by: 30)
        let second = try #require(try cache.token(afterRejecting: first, for: Fixtures.credentials))
        #expect(clock.now.timeIntervalSince(second.issuedAt) >= 60)
        #expect(second.issuedAt.timeIntervalSince(first.issuedAt) >= 20 * 60)
    }

    @Test func nonES256KeysAreRefused() throws {
        let rsa = APNsCredentials(teamID: "TEAM123456", keyID: "RSAKEY1234", privateKey: try PrivateKey.generateRSA())
        let cache = APNsProviderTokenCache(metrics: MetricsRegistry())
        #expect { _ = try cache.token(for: rsa) } throws: { ($0 as? APNsError)?.code == .providerTokenFailure }
    }
}
