import HeraldCore
import HeraldFuzzSupport
import HeraldHTTP
import HeraldRuntime

/// Live Activity registration's request handling: the body through `JSONDecoder` into `ActivityRegistrationBody`
/// (as the endpoint reads it) and then the checks, giving a whole input or a 400. The same body parsed by
/// `JSONValue` must be judged the same way, since both readers exist.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let request = HTTPRequest(method: .post, path: "/api/v1/activities/register", route: "/api/v1/activities/register",
                              body: bytes, requestID: "fuzz")
    let decoded: ActivityRegistrationBody
    do {
        decoded = try request.decodeJSON(ActivityRegistrationBody.self)
    } catch {
        require(error.status == 400, "unexpected \(error)")
        return 0
    }
    let result = Result { () throws(ValidationError) in try ActivityRegistrationInput(decoded, app: FuzzKeys.app) }
    if case .success(let input) = result {
        require(input.pushToken.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) },
                "accepted push token \(input.pushToken)")
        require((try? PostIDHash.validate(input.postIDHash, field: "post_id_hash")) != nil, "accepted post id hash")
        require(BundleID.isWellFormed(input.bundleID) && FuzzKeys.app.owns(bundleID: input.bundleID),
                "accepted bundle id \(input.bundleID)")
    }
    // Both readers must judge a body both can parse alike.
    guard let json = JSONValue(parsing: bytes) else { return 0 }
    let other = Result { () throws(ValidationError) in try ActivityRegistrationInput(json, app: FuzzKeys.app) }
    require(other == result, "JSONDecoder gives \(result), JSONValue gives \(other)")
    return 0
}
