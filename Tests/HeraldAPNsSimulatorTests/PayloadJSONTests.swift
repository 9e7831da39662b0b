import Foundation
@testable import HeraldAPNsSimulator
import HeraldRuntime
import Testing

@Suite("APNs simulator payload JSON")
struct PayloadJSONTests {
    @Test("parses RFC 8259 JSON into the same values as JSONDecoder")
    func parsesLikeFoundation() throws {
        let documents = [
            #"{"aps":{"alert":{"title":"Hi \"you\"","body":"line\nbreak \u00e9 \ud83d\ude00 /\/"},"badge":3,"content-available":1,"sound":null},"flag":true,"off":false,"n":-1.5e3,"list":[1,[],{}]}"#,
            "  {\"a\" : [ 0 , -0.25 , 12E+2 ] }\n",
            #"{"unicode":"日本語","empty":""}"#,
        ]
        for document in documents {
            let expected = try JSONDecoder().decode(JSONValue.self, from: Data(document.utf8))
            let parsed = try #require(JSONValue(parsing: Array(document.utf8)), "\(document)")
            #expect(parsed == expected)
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            #expect(parsed.encoded() == Array(try encoder.encode(expected)))
        }
        #expect(JSONValue(parsing: Array(#"{"a":true,"b":1}"#.utf8)) == .object(["a": .bool(true), "b": .number(1)]))
    }

    @Test("refuses what is not exactly one JSON value")
    func refusesInvalid() {
        let invalid = [
            "", " ", "{", "{\"a\":1,}", "[1,]", "{\"a\" 1}", "{a:1}", "01", "1.", ".5", "-", "+1", "NaN", "1e",
            "\"unterminated", "\"tab\there\"", "{\"a\":1} x", "tru", "nul", "\"\\x\"", "\"\\ud800\"", "{} {}",
            String(repeating: "[", count: 100) + String(repeating: "]", count: 100),
        ]
        for text in invalid {
            #expect(JSONValue(parsing: Array(text.utf8)) == nil, "\(text)")
        }
        #expect(JSONValue(parsing: [0x22, 0xFF, 0x22]) == nil)
    }

    @Test("an accepted push's record line is the sorted-key JSON object of its fields")
    func acceptedRecordLine() throws {
        let payload = try #require(JSONValue(parsing: Array(#"{"aps":{"alert":{"body":"say \"hi\"\n"}},"z":[1,2.5]}"#.utf8)))
        var push = AcceptedPush(token: String(repeating: "ab", count: 32), topic: "com.example.app",
                                pushType: .alert, priority: 5, expiration: 1_900_000_000,
                                collapseID: "score \"42\"", payload: payload)
        push.providerTokenIssuedAt = 1_700_000_000
        let apnsID = "6b0c9f1e-1234-4cde-8f00-0123456789ab"
        for (pushed, line) in [(push, 1), ({ var bare = push; bare.expiration = nil; bare.collapseID = nil; return bare }(), 2)] {
            var out: [UInt8] = Array("previous line\n".utf8)
            RecordLine.appendAccepted(pushed, apnsID: apnsID, time: 1_700_000_000.1234, connection: line, to: &out)
            let expected: JSONValue = .object([
                "time": .number(1_700_000_000_123), "status": .number(200), "apnsId": .string(apnsID),
                "token": .string(pushed.token), "topic": .string(pushed.topic), "pushType": .string("alert"),
                "priority": .number(5), "expiration": pushed.expiration.map { .number(Double($0)) } ?? .null,
                "collapseId": pushed.collapseID.map { .string($0) } ?? .null, "payload": payload,
                "connection": .number(Double(line)), "providerTokenIssuedAt": .number(1_700_000_000),
            ])
            #expect(out == Array("previous line\n".utf8) + expected.encoded() + [UInt8(ascii: "\n")])
        }
    }
}
