@testable import HeraldHTTP
import HeraldTestSupport
import Testing

@Suite("HTTP router and types")
struct RouterTests {
    private func router() -> Router {
        var router = Router()
        router.post("/v1/apps/{appID}/subscriptions") { _ in .noContent }
        router.delete("/v1/apps/{appID}/subscriptions") { _ in .noContent }
        router.post("/v1/apps/{appID}/activities/{postIdHash}/events") { _ in .noContent }
        router.post("/api/v1/activities/register") { _ in .noContent }
        router.get("/healthz") { _ in .noContent }
        return router
    }

    @Test func matchesParametersAndDecodesThem() throws {
        guard case .found(let route, let parameters) = router().match(
            method: .post, path: "/v1/apps/my%20app/activities/ab%2Fc/events") else {
            Issue.record("no match")
            return
        }
        #expect(route.pattern == "/v1/apps/{appID}/activities/{postIdHash}/events")
        #expect(parameters == ["appID": "my app", "postIdHash": "ab/c"])
    }

    @Test func unknownPathsAreNotFound() {
        let router = router()
        for path in ["/", "/v1/apps", "/v1/apps//subscriptions", "/v1/apps/a/subscriptions/", "/healthz/x",
                     "/v1/apps/%zz/subscriptions", "/v1/apps/%FF/subscriptions", "healthz"] {
            guard case .notFound = router.match(method: .post, path: path) else {
                Issue.record("\(path) should not match")
                continue
            }
        }
    }

    @Test func otherMethodOnAKnownPathListsTheAllowedOnes() {
        guard case .methodNotAllowed(let pattern, let allowed) = router().match(
            method: .get, path: "/v1/apps/a/subscriptions") else {
            Issue.record("expected 405")
            return
        }
        #expect(pattern == "/v1/apps/{appID}/subscriptions")
        #expect(allowed == [.post, .delete])
        #expect(HTTPError.methodNotAllowed(allowed: allowed).headers["Allow"] == "POST, DELETE")
    }

    @Test func errorBodyHasTheContractShape() {
        let withField = HTTPError.invalidJSON("missing field \"channel\"", field: "channel").response
        #expect(withField.status == 400)
        #expect(withField.headers["content-type"] == "application/json")
        #expect(String(decoding: withField.body, as: UTF8.self)
            == #"{"error":{"code":"invalid_json","message":"missing field \"channel\"","field":"channel"}}"#)
        let withoutField = HTTPError.notFound().response
        #expect(String(decoding: withoutField.body, as: UTF8.self)
            == #"{"error":{"code":"not_found","message":"no such resource"}}"#)
    }

    @Test func requestIDsFromClientsAreKeptOnlyWhenSane() {
        #expect(RequestEngine.requestID(fromHeader: "abc-123") == "abc-123")
        let generated = [nil, "", String(repeating: "x", count: 129), "has space", "tab\there", "é"].map {
            RequestEngine.requestID(fromHeader: $0)
        }
        for id in generated {
            #expect(id.count == 32 && id.allSatisfy(\.isHexDigit))
        }
        #expect(Set(generated).count == generated.count)
    }

    @Test func jsonContentTypeAllowsParameters() {
        #expect(RequestEngine.isJSON(contentType: "application/json"))
        #expect(RequestEngine.isJSON(contentType: "Application/JSON; charset=utf-8"))
        #expect(!RequestEngine.isJSON(contentType: "text/plain"))
        #expect(!RequestEngine.isJSON(contentType: "application/jsonx"))
        #expect(!RequestEngine.isJSON(contentType: nil))
        #expect(RequestEngine.isJSON(contentType: " \tAPPLICATION/json \t; charset=utf-8"))
        #expect(RequestEngine.isJSON(contentType: "application/json;"))
        for refused in ["", ";application/json", "application /json", "application/json\u{0}", "application\u{0F}json",
                        "application/jsoñ", "application/json\u{301}", "@PPLICATION/JSON",
                        "application/jso", "application/json x", "application\u{212A}json"] {
            #expect(!RequestEngine.isJSON(contentType: refused), "\(refused)")
        }
        // Unicode rules still apply to a non-ASCII value: U+037E is canonically a ";".
        #expect(RequestEngine.isJSON(contentType: "application/json\u{37E} charset=utf-8"))
    }

    @Test func decodingErrorsNameTheField() {
        struct Body: Decodable { var channel: String; var count: Int }
        func failure(_ json: String) -> HTTPError? {
            let request = HTTPRequest(method: .post, path: "/", route: "/", body: Array(json.utf8), requestID: "r")
            let result = Result { () throws(HTTPError) in try request.decodeJSON(Body.self) }
            if case .failure(let error) = result { return error }
            return nil
        }
        #expect(failure(#"{"count": 1}"#) == .invalidJSON("missing field \"channel\"", field: "channel"))
        #expect(failure(#"{"channel": "a", "count": "x"}"#)
            == .invalidJSON("field \"count\" must be an integer", field: "count"))
        #expect(failure(#"{"channel": null, "count": 1}"#)?.field == "channel")
        #expect(failure("{nope") == .invalidJSON("the request body is not valid JSON"))
        #expect(failure("") == .invalidJSON("the request body is empty"))
        #expect(failure(#"{"channel": "a", "count": 2}"#) == nil)
    }
}
