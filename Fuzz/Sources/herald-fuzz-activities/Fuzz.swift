import HeraldCore
import HeraldFuzzSupport
import HeraldHTTP
import HeraldRuntime

/// Live Activity registration's request handling: bytes → JSON or 400 `invalid_json` → checked input or 400,
/// for the app `com.example.app`. An accepted input holds only what the rules allow, and the accepted body's
/// canonical JSON gives the same input (no member read one way here and another way elsewhere).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    func request(_ body: [UInt8]) -> HTTPRequest {
        HTTPRequest(method: .post, path: "/api/v1/activities/register", route: "/api/v1/activities/register",
                    body: body, requestID: "fuzz")
    }
    let json: JSONValue, input: ActivityRegistrationInput
    do {
        json = try request(bytes).jsonBody()
        input = try ActivityRegistrationInput(json, app: FuzzKeys.app)
    } catch let error as HTTPError {
        require(error.status == 400 && error.code == "invalid_json", "unexpected \(error)")
        return 0
    } catch {
        require(error is ValidationError, "unexpected \(error)")
        return 0
    }
    require(input.pushToken.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) },
            "accepted push token \(input.pushToken)")
    require((try? PostIDHash.validate(input.postIDHash, field: "post_id_hash")) != nil, "accepted post id hash")
    require(BundleID.isWellFormed(input.bundleID) && FuzzKeys.app.owns(bundleID: input.bundleID),
            "accepted bundle id \(input.bundleID)")
    let again = try? ActivityRegistrationInput(try request(json.encoded()).jsonBody(), app: FuzzKeys.app)
    require(again == input, "the canonical body gives another input")
    return 0
}
