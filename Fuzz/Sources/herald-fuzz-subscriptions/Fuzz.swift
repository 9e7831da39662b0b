import HeraldCore
import HeraldFuzzSupport
import HeraldHTTP
import HeraldRuntime

/// The subscription endpoints' request handling: `POST` and `DELETE` bodies (bytes → JSON or 400 `invalid_json` →
/// checked input or 400) and `GET`'s query (arguments → `deviceToken` → normalised token or 400). The first byte
/// picks the endpoint. Checking is pure: a body either yields a whole input or an error, and the same input
/// from the accepted body's canonical JSON.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 0 else { return 0 }
    let bytes = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    switch data[0] % 3 {
    case 0: post(bytes)
    case 1: delete(bytes)
    default: get(bytes)
    }
    return 0
}

private func request(_ body: [UInt8]) -> HTTPRequest {
    HTTPRequest(method: .post, path: "/v1/apps/app1/subscriptions", route: "/v1/apps/{appID}/subscriptions",
                body: body, requestID: "fuzz")
}

/// The error a request ends with must be a 400 (a `ValidationError` is rendered as one).
private func expectRefusal(_ error: any Error) {
    switch error {
    case let error as HTTPError: require(error.status == 400 && error.code == "invalid_json", "unexpected \(error)")
    case is ValidationError: break
    default: fatalError("invariant broken: unexpected error \(error)")
    }
}

private func isToken(_ token: String) -> Bool {
    DeviceToken.hexLengths.contains(token.utf8.count) && token.utf8.count % 2 == 0
        && token.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
}

private func post(_ bytes: [UInt8]) {
    do {
        let body = try request(bytes).jsonBody()
        let input = try SubscriptionInput(body)
        require(isToken(input.deviceToken), "accepted token \(input.deviceToken)")
        require(input.previousToken.map(isToken) ?? true, "accepted previous token")
        require((try? Channel.validate(input.channel)) != nil, "accepted channel \(input.channel)")
        require(input.tokenType != .liveActivityUpdate || input.activityID != nil, "live activity without activityID")
        require((input.metadata?.encoded().count ?? 0) <= SubscriptionInput.maxMetadataBytes, "metadata too large")
        let again = try SubscriptionInput(try request(body.encoded()).jsonBody())
        require(again == input, "the canonical body gives another input")
    } catch {
        expectRefusal(error)
    }
}

private func delete(_ bytes: [UInt8]) {
    do {
        let body = try request(bytes).jsonBody()
        let removal = try SubscriptionRemoval(body)
        require(isToken(removal.deviceToken), "accepted token \(removal.deviceToken)")
        require((removal.channel == nil) == (removal.tokenType == nil), "channel without tokenType or back")
        let again = try SubscriptionRemoval(try request(body.encoded()).jsonBody())
        require(again == removal, "the canonical body gives another removal")
    } catch {
        expectRefusal(error)
    }
}

/// The query string as the HTTP library splits it (`&`, then the first `=`), still percent-encoded.
private func get(_ bytes: [UInt8]) {
    let raw = String(decoding: bytes, as: UTF8.self)
    let arguments = raw.split(separator: "&").map { pair -> (name: String, value: String) in
        let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
        return (String(parts[0]), parts.count > 1 ? String(parts[1]) : "")
    }
    let query = HTTPRequest.query(arguments: arguments)
    guard let token = query["deviceToken"] else { return }
    do {
        let normalized = try DeviceToken.normalized(token, field: "deviceToken")
        require(isToken(normalized) && normalized == token.lowercased(), "accepted token \(normalized)")
    } catch {
        expectRefusal(error)
    }
}
