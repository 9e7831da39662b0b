import Foundation
import HeraldCore
import HeraldRuntime

extension DeadLetter {
    /// The job that sends this push again (`replayJob`), checked and encoded, with the payload's JSON text
    /// copied from `record` instead of encoded again (that encoding was the larger part of a replay's CPU time).
    /// Nil when there is no device, channel or payload to send; throws when the job would be invalid.
    func replayRecord(record: [UInt8], partition: Int32, offset: Int64, id: String, now: Date) throws(ValidationError)
        -> (key: String, bytes: [UInt8])? {
        guard var job = replayJob(partition: partition, offset: offset, id: id, now: now),
              let raw = RawJSON.member("payload", of: record) else { return nil }
        // A stand-in payload of the right shape lets `validate` check everything else; the real one's shape was
        // checked when it decoded (`payload` is an object) and its size is checked here.
        guard case .object(let members)? = job.payload, case .object? = members["aps"] else {
            throw .invalid("payload", "payload must have an aps object")
        }
        // Whether the payload only wakes the app decides its push type and priorities: the stand-in keeps that.
        let wakesOnly = job.payload.map(APNsPayload.isBackgroundOnly) == true
        job.payload = .object(["aps": .object(wakesOnly ? ["content-available": .number(1)] : [:])])
        try job.validate()
        let limit = job.payloadLimit
        guard raw.count <= limit else {
            throw ValidationError(code: "payload_too_large", message: "the payload is \(raw.count) bytes; APNs accepts at most \(limit)",
                                  field: "payload")
        }
        job.payload = .null
        guard let bytes = RawJSON.replacing(Array(#""payload":null"#.utf8), with: Array(#""payload":"#.utf8) + record[raw],
                                            in: job.encoded()) else { return nil }
        return (job.recordKey, bytes)
    }
}

/// Finds members of a JSON object as byte ranges of its text, so a value can be copied without decoding it.
enum RawJSON {
    /// The range of the value of `key` in the top-level object `json`; nil when absent or when the text is not
    /// a well-formed object (or spells the key with escapes: the caller then has nothing to copy).
    static func member(_ key: String, of json: [UInt8]) -> Range<Int>? {
        let wanted = Array(key.utf8)
        var index = skipSpace(json, 0)
        guard index < json.count, json[index] == UInt8(ascii: "{") else { return nil }
        index += 1
        while true {
            index = skipSpace(json, index)
            guard index < json.count, json[index] == UInt8(ascii: "\"") else { return nil }
            guard let keyEnd = skipString(json, index) else { return nil }
            let name = json[(index + 1)..<(keyEnd - 1)]
            index = skipSpace(json, keyEnd)
            guard index < json.count, json[index] == UInt8(ascii: ":") else { return nil }
            let valueStart = skipSpace(json, index + 1)
            guard let valueEnd = skipValue(json, valueStart) else { return nil }
            if name.elementsEqual(wanted) { return valueStart..<valueEnd }
            index = skipSpace(json, valueEnd)
            guard index < json.count else { return nil }
            if json[index] == UInt8(ascii: "}") { return nil }
            guard json[index] == UInt8(ascii: ",") else { return nil }
            index += 1
        }
    }

    /// `bytes` with the first occurrence of `pattern` replaced. Used on JSONEncoder output, where a quote that
    /// is part of a string value is always escaped, so `"payload":null` can only be the member itself.
    static func replacing(_ pattern: [UInt8], with replacement: some Collection<UInt8>, in bytes: [UInt8]) -> [UInt8]? {
        guard pattern.count <= bytes.count else { return nil }
        for start in 0...(bytes.count - pattern.count) where bytes[start] == pattern[0] {
            if bytes[start..<(start + pattern.count)].elementsEqual(pattern) {
                var out = Array(bytes[..<start])
                out.reserveCapacity(bytes.count + replacement.count)
                out.append(contentsOf: replacement)
                out.append(contentsOf: bytes[(start + pattern.count)...])
                return out
            }
        }
        return nil
    }

    private static func skipSpace(_ json: [UInt8], _ start: Int) -> Int {
        var index = start
        while index < json.count, [0x20, 0x09, 0x0a, 0x0d].contains(json[index]) { index += 1 }
        return index
    }

    /// From an opening quote to just after the closing one.
    private static func skipString(_ json: [UInt8], _ start: Int) -> Int? {
        var index = start + 1
        while index < json.count {
            switch json[index] {
            case UInt8(ascii: "\\"): index += 2
            case UInt8(ascii: "\""): return index + 1
            default: index += 1
            }
        }
        return nil
    }

    /// Just after the value starting at `start`: a string, an object or array (nesting counted, strings skipped
    /// whole), or a number or literal.
    private static func skipValue(_ json: [UInt8], _ start: Int) -> Int? {
        guard start < json.count else { return nil }
        switch json[start] {
        case UInt8(ascii: "\""):
            return skipString(json, start)
        case UInt8(ascii: "{"), UInt8(ascii: "["):
            var depth = 0, index = start
            while index < json.count {
                switch json[index] {
                case UInt8(ascii: "\""):
                    guard let end = skipString(json, index) else { return nil }
                    index = end
                    continue
                case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1
                case UInt8(ascii: "}"), UInt8(ascii: "]"):
                    depth -= 1
                    if depth == 0 { return index + 1 }
                default: break
                }
                index += 1
            }
            return nil
        default:
            var index = start
            while index < json.count, ![UInt8(ascii: ","), UInt8(ascii: "}"), UInt8(ascii: "]"), 0x20, 0x09, 0x0a, 0x0d]
                .contains(json[index]) { index += 1 }
            return index > start ? index : nil
        }
    }
}
