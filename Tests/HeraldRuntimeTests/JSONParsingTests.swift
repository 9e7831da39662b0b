import Foundation
import HeraldRuntime
import Testing

@Suite struct JSONParsingTests {
    @Test func parsesWhatJSONDecoderParses() throws {
        let documents = [
            #"{"channel": "order:42", "n": 42, "pi": 3.25, "neg": -1e3, "ok": true, "no": false, "none": null}"#,
            #"[1, [2, [3, {}]], [], "x"]"#,
            #"{"esc": "quote \" backslash \\ slash \/ \b\f\n\r\t \u00e9 \ud83d\ude00"}"#,
            #"  "  padded  "  "#,
            "{\"utf8\": \"é日本😀\"}",
            "0", "-0.5", "1E+2",
        ]
        for text in documents {
            let ours = JSONValue(parsing: Array(text.utf8))
            let foundation = try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))
            #expect(ours == foundation, "\(text)")
        }
    }

    @Test func refusesWhatIsNotExactlyOneJSONValue() {
        let bad = ["", " ", "{", "{\"a\" 1}", "{\"a\": 1,}", "[1,]", "01", "1.", ".5", "+1", "-", "tru", "nul",
                   "\"open", "\"bad \\x escape\"", "\"raw \u{1} control\"", "\"\\ud800\"", "\"\\udc00\"",
                   "{\"a\": 1} {}", "{'a': 1}", "1e999", "NaN"]
        for text in bad { #expect(JSONValue(parsing: Array(text.utf8)) == nil, "\(text)") }
        #expect(JSONValue(parsing: [0x22, 0xFF, 0xFE, 0x22]) == nil, "invalid UTF-8")
    }

    /// A 64-bit id sent as a number would reach the device changed (a Double holds integers exactly up to 2^53):
    /// such an integer is refused; up to 2^53 integers keep their digits both ways.
    @Test func refusesIntegersADoubleCannotHoldAndWritesTheRestWhole() throws {
        // 2^53 + 2 and 10^16 are exact Doubles, but beyond 2^53 most integers are not: all are refused alike.
        for text in ["9007199254740993", "-9007199254740993", "9007199254740994", "10000000000000000",
                     "12345678901234567890", #"{"orderId": 1234567890123456789}"#] {
            #expect(JSONValue(parsing: Array(text.utf8)) == nil, "\(text)")
            #expect(JSONValue(parsing: Array(text.utf8), exactIntegers: false) != nil, "\(text), read only")
        }
        for text in ["9007199254740992", "-9007199254740992", "9000000000000001", "123456789012345"] {
            let value = try #require(JSONValue(parsing: Array(text.utf8)), "\(text)")
            #expect(String(decoding: value.encoded(), as: UTF8.self) == text)
        }
        // Written with a fraction or an exponent, a number is a Double by its writer's choice.
        #expect(JSONValue(parsing: Array("1e20".utf8)) == .number(1e20))
        #expect(JSONValue(parsing: Array("12345678901234567890.5".utf8)) != nil)
    }

    /// Found by scripts/fuzz (activities): `JSONDecoder` kept the first `push_token`, this parser the last, so the
    /// activities endpoint and the other readers judged one body differently. A member named twice is refused.
    @Test func refusesAMemberNamedTwice() {
        let found = #"{"push_token": "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1", "push_token": "a1.gxa'ple.app.widget"}"#
        for text in [found, #"{"a": 1, "a": 1}"#, #"{"x": {"b": true, "b": false}}"#, #"[{"k": 1, "k": null}]"#] {
            #expect(JSONValue(parsing: Array(text.utf8)) == nil, "\(text)")
        }
        #expect(JSONValue(parsing: Array(#"{"a": {"a": 1}, "b": [{"a": 2}]}"#.utf8)) != nil, "one name at two levels")
    }

    @Test func refusesNestingDeeperThanTheLimit() {
        let depth = JSONValue.maximumParsingDepth
        #expect(JSONValue(parsing: Array((String(repeating: "[", count: depth) + String(repeating: "]", count: depth)).utf8)) != nil)
        #expect(JSONValue(parsing: Array((String(repeating: "[", count: depth + 1) + String(repeating: "]", count: depth + 1)).utf8)) == nil)
    }

    /// Text with nothing to escape is copied as is; anything with a quote, backslash or control character takes
    /// the escaping path, and both agree with `JSONDecoder` on the way back.
    @Test func quotesPlainTextAsIsAndEscapesTheRest() throws {
        let cases: [(String, String)] = [
            ("", #""""#), ("order:42:status", #""order:42:status""#), ("é日本😀 ~", #""é日本😀 ~""#),
            ("a\"b", #""a\"b""#), ("back\\slash", #""back\\slash""#), ("tab\tnl\ncr\r", #""tab\tnl\ncr\r""#),
            ("\u{1}\u{1f}", #""\u0001\u001f""#), ("end\u{7f}", "\"end\u{7f}\""),
        ]
        for (text, expected) in cases {
            var out: [UInt8] = Array("x".utf8)
            JSONValue.appendQuoted(text, to: &out)
            #expect(String(decoding: out.dropFirst(), as: UTF8.self) == expected, "\(text)")
            #expect(try JSONDecoder().decode(String.self, from: Data(out.dropFirst())) == text)
        }
    }

    @Test func serialisesCompactlyWithSortedKeysAndRoundTrips() {
        let value = JSONValue.object(["b": .array([.number(1), .number(2.5), .null, .bool(true)]),
                                      "a": .string("line\nquote\" \u{1} é"), "c": .object([:])])
        let text = String(decoding: value.encoded(), as: UTF8.self)
        #expect(text == #"{"a":"line\nquote\" \u0001 é","b":[1,2.5,null,true],"c":{}}"#)
        #expect(JSONValue(parsing: value.encoded()) == value)
        #expect(value.encoded().count == value.encoded().count, "same size as JSONEncoder's output")
    }
}
