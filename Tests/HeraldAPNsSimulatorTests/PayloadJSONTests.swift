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
}
