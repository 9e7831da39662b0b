import HeraldFuzzSupport
import HeraldHTTP

/// The HTTP/1.1 request parser of herald-ingest's server (`HTTPRequestParser.parseHead`, `ChunkedBodyDecoder`,
/// query splitting) on arbitrary bytes: never crashes or reads past its input, consumes at most what it is given,
/// keeps the header and body limits, answers the same whether a body arrives at once or in two pieces, and never
/// calls a head complete before its last byte; fed a byte at a time with one scan, it answers as a fresh parse.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = UnsafeRawBufferPointer(start: data, count: size)
    let limit = 2048
    checkResumed(input, limit: limit)
    switch HTTPRequestParser.parseHead(input, limit: limit) {
    case .incomplete:
        require(size < limit, "incomplete at \(size) bytes, over the limit")
    case .failed(let failure):
        require([400, 413, 431, 501, 505].contains(failure.status), "status \(failure.status)")
    case .complete(let head, let length):
        require(length <= size && length <= limit, "head of \(length) bytes from \(size)")
        require(head.path.hasPrefix("/") && !head.path.contains("?"), "path \(head.path)")
        require(!head.method.isEmpty && !head.method.contains(" "), "method \(head.method)")
        require(head.minorVersion == 0 || head.minorVersion == 1, "version 1.\(head.minorVersion)")
        if case .complete = HTTPRequestParser.parseHead(UnsafeRawBufferPointer(rebasing: input[..<(length - 1)]),
                                                        limit: limit) {
            fatalError("invariant broken: a head was complete one byte early")
        }
        if case .complete(_, let again) = HTTPRequestParser.parseHead(UnsafeRawBufferPointer(rebasing: input[..<length]),
                                                                      limit: limit) {
            require(again == length, "the head alone parsed to \(again) bytes, not \(length)")
        } else {
            fatalError("invariant broken: the head alone did not parse")
        }
        if let query = head.query {
            _ = HTTPRequest.query(arguments: HTTPRequestParser.arguments(ofQuery: query))
        }
        if case .success(.length(let declared)) = head.framing { require(declared > 0, "length \(declared)") }
        if case .success(.chunked) = head.framing {
            checkChunked(UnsafeRawBufferPointer(rebasing: input[length...]))
        }
    }
    return 0
}

/// Parses the input a byte at a time, each parse going on from the last one's scan (as the server does while a head
/// arrives): where that first answers other than incomplete, and at the end, a fresh parse answers the same.
private func checkResumed(_ input: UnsafeRawBufferPointer, limit: Int) {
    func outcome(_ head: HTTPRequestParser.Head) -> String {
        switch head {
        case .incomplete: "incomplete"
        case .failed(let failure): "failed \(failure.status) \(failure.message)"
        case .complete(_, let length): "complete \(length)"
        }
    }
    var scan = HTTPRequestParser.HeadScan()
    var resumed = "incomplete", count = 0
    while count < input.count, resumed == "incomplete" {
        count += 1
        resumed = outcome(HTTPRequestParser.parseHead(UnsafeRawBufferPointer(rebasing: input[..<count]), limit: limit,
                                                      resuming: &scan))
    }
    let fresh = outcome(HTTPRequestParser.parseHead(UnsafeRawBufferPointer(rebasing: input[..<count]), limit: limit))
    require(resumed == fresh, "\(count) bytes a byte at a time: \(resumed); at once: \(fresh)")
}

/// Decodes the rest as a chunked body at once and in two pieces (split where its first byte says): same outcome.
private func checkChunked(_ rest: UnsafeRawBufferPointer) {
    let bodyLimit = 64
    func decoder() -> ChunkedBodyDecoder { ChunkedBodyDecoder(limit: bodyLimit, discardAllowance: 256, framingLimit: 512) }
    var whole = decoder()
    var body: [UInt8] = []
    let (consumed, progress) = whole.decode(rest, into: &body)
    require(consumed <= rest.count && body.count <= bodyLimit, "consumed \(consumed) of \(rest.count), kept \(body.count)")
    require(whole.received <= bodyLimit + 256, "received \(whole.received) past the allowance")

    let split = rest.isEmpty ? 0 : Int(rest[0]) % (rest.count + 1)
    var pieces = decoder()
    var pieceBody: [UInt8] = []
    var (first, firstProgress) = pieces.decode(UnsafeRawBufferPointer(rebasing: rest[..<split]), into: &pieceBody)
    require(first <= split, "consumed \(first) of \(split)")
    if firstProgress == .needMore {
        let (second, secondProgress) = pieces.decode(UnsafeRawBufferPointer(rebasing: rest[split...]), into: &pieceBody)
        first += second
        firstProgress = secondProgress
    }
    require(first == consumed && firstProgress == progress && pieceBody == body,
            "split at \(split): \(first) \(firstProgress) vs \(consumed) \(progress)")
}
