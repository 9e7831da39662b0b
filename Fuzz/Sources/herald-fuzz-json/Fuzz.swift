import HeraldRuntime

/// `JSONValue(parsing:)`, the strict parser behind every hot request body: whatever it accepts serialises to
/// canonical JSON that parses back to the same value and serialises to the same bytes.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    guard let value = JSONValue(parsing: bytes) else { return 0 }
    let encoded = value.encoded()
    guard let again = JSONValue(parsing: encoded) else {
        fatalError("invariant broken: the encoding of a parsed value does not parse: \(String(decoding: encoded, as: UTF8.self))")
    }
    if again != value { fatalError("invariant broken: parse → encode → parse changed the value") }
    if again.encoded() != encoded { fatalError("invariant broken: encoding is not canonical") }
    return 0
}
