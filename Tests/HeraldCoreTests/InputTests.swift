import Foundation
import HeraldCore
import HeraldRuntime
import Testing

func json(_ text: String) -> JSONValue { try! JSONDecoder().decode(JSONValue.self, from: Data(text.utf8)) }

let token = String(repeating: "a1", count: 32)

@Suite struct SubscriptionInputTests {
    @Test func acceptsThePublishedExampleAndNormalizesTheToken() throws {
        let input = try SubscriptionInput(json("""
            {"channel": "order:42:status", "deviceToken": "\(token.uppercased())", "tokenType": "alert",
             "environment": "production", "activityID": null, "metadata": {"locale": "en_US"}, "previousToken": null}
            """))
        #expect(input.channel == "order:42:status" && input.deviceToken == token && input.tokenType == .alert)
        #expect(input.environment == .production && input.activityID == nil && input.previousToken == nil)
        #expect(input.metadata == json(#"{"locale": "en_US"}"#))
    }

    /// The metadata is encoded once, when checked, and that encoding is what Redis and the response get: it must
    /// stay the value's own encoding (compact, keys sorted), also after the metadata is changed.
    @Test func encodedMetadataIsTheMetadataEncodingAndFollowsChanges() throws {
        var input = try SubscriptionInput(json("""
            {"channel": "c", "deviceToken": "\(token)", "tokenType": "alert", "metadata": {"z": [1, 2.5], "a": "é\\n"}}
            """))
        #expect(input.encodedMetadata.map { String(decoding: $0, as: UTF8.self) } == #"{"a":"é\n","z":[1,2.5]}"#)
        #expect(input.encodedMetadata == input.metadata?.encoded())
        input.metadata = json(#"{"b": true}"#)
        #expect(input.encodedMetadata.map { String(decoding: $0, as: UTF8.self) } == #"{"b":true}"#)
        input.metadata = nil
        #expect(input.encodedMetadata == nil)
        let bare = try SubscriptionInput(json(#"{"channel": "c", "deviceToken": "\#(token)", "tokenType": "alert"}"#))
        #expect(bare.encodedMetadata == nil)
    }

    /// Of several unknown fields, the first in sorted order is reported, whatever order the body had.
    @Test func theFirstUnknownFieldInSortedOrderIsReported() {
        let body = #"{"zeta": 1, "channel": "c", "beta": 2, "deviceToken": "\#(token)", "tokenType": "alert", "mu": 3}"#
        #expect { try SubscriptionInput(json(body)) } throws: { ($0 as? ValidationError)?.field == "beta" }
    }

    @Test(arguments: [
        (#"{"channel": "\#(String(repeating: "c", count: 256))", "deviceToken": "\#(token)", "tokenType": "alert"}"#, "channel"),
        (#"{"channel": "a\u0007b", "deviceToken": "\#(token)", "tokenType": "alert"}"#, "channel"),
        (#"{"deviceToken": "\#(token)", "tokenType": "alert"}"#, "channel"),
        (#"{"channel": "c", "deviceToken": "abc", "tokenType": "alert"}"#, "deviceToken"),
        (#"{"channel": "c", "deviceToken": "zz\#(token)", "tokenType": "alert"}"#, "deviceToken"),
        (#"{"channel": "c", "deviceToken": "\#(token)", "tokenType": "banner"}"#, "tokenType"),
        (#"{"channel": "c", "deviceToken": "\#(token)", "tokenType": "liveactivity-update"}"#, "activityID"),
        (#"{"channel": "c", "deviceToken": "\#(token)", "tokenType": "alert", "metadata": [1]}"#, "metadata"),
        (#"{"channel": "c", "deviceToken": "\#(token)", "tokenType": "alert", "metadata": {"x": "\#(String(repeating: "m", count: 4100))"}}"#, "metadata"),
        (#"{"channel": "c", "deviceToken": "\#(token)", "tokenType": "alert", "environment": "staging"}"#, "environment"),
        (#"{"channel": "c", "deviceToken": "\#(token)", "tokenType": "alert", "previousToken": "xyz"}"#, "previousToken"),
        (#"{"channel": 5, "deviceToken": "\#(token)", "tokenType": "alert"}"#, "channel"),
        (#"{"channel": "c", "deviceToken": "\#(token)", "tokenType": "alert", "surprise": 1}"#, "surprise"),
    ])
    func rejectsEachBrokenRuleWithItsField(body: String, field: String) {
        #expect { try SubscriptionInput(json(body)) } throws: { ($0 as? ValidationError)?.field == field }
    }

    @Test func channelControlCharactersAreRefusedInAndOutOfASCII() throws {
        for channel in ["a\u{0}", "a\tb", "\u{1f}", "a\u{7f}", "a\u{85}b", "\u{9f}"] {
            #expect(throws: ValidationError.self) { try Channel.validate(channel) }
        }
        for channel in [" ", "~", "order:1:status", "é", "\u{a0}", "\u{1F600}"] { try Channel.validate(channel) }
    }

    @Test func channelOf255CharactersIsAccepted() throws {
        let channel = String(repeating: "é", count: 255)
        let input = try SubscriptionInput(json(#"{"channel": "\#(channel)", "deviceToken": "\#(token)", "tokenType": "alert"}"#))
        #expect(input.channel == channel)
    }

    @Test func removalNeedsChannelAndTokenTypeTogether() throws {
        let all = try SubscriptionRemoval(json(#"{"deviceToken": "\#(token)"}"#))
        #expect(all.channel == nil && all.tokenType == nil)
        let one = try SubscriptionRemoval(json(#"{"deviceToken": "\#(token)", "channel": "c", "tokenType": "alert"}"#))
        #expect(one.channel == "c" && one.tokenType == .alert)
        #expect(throws: ValidationError.self) { try SubscriptionRemoval(json(#"{"deviceToken": "\#(token)", "channel": "c"}"#)) }
        #expect(throws: ValidationError.self) { try SubscriptionRemoval(json(#"{"deviceToken": "\#(token)", "tokenType": "alert"}"#)) }
    }
}

@Suite struct ActivityRegistrationInputTests {
    @Test func validatesBundleOwnershipAndPostHash() throws {
        let app = try #require(try AppsFixture().directory.apps["shop"])
        let ok = try ActivityRegistrationInput(json("""
            {"push_token": "\(token)", "post_id_hash": "0123abcd", "bundle_id": "com.example.shop.widgets"}
            """), app: app)
        #expect(ok.environment == .production && ok.bundleID == "com.example.shop.widgets")
        for (body, field) in [
            (#"{"push_token": "\#(token)", "post_id_hash": "0123abcd", "bundle_id": "com.example.shopping"}"#, "bundle_id"),
            (#"{"push_token": "\#(token)", "post_id_hash": "0123ABCD", "bundle_id": "com.example.shop"}"#, "post_id_hash"),
            (#"{"push_token": "\#(token)", "post_id_hash": "0123abc", "bundle_id": "com.example.shop"}"#, "post_id_hash"),
            (#"{"push_token": "nothex", "post_id_hash": "0123abcd", "bundle_id": "com.example.shop"}"#, "push_token"),
            (#"{"push_token": "\#(token)", "post_id_hash": "0123abcd", "bundle_id": "com.example.shop", "apns_environment": "dev"}"#, "apns_environment"),
        ] {
            #expect { try ActivityRegistrationInput(json(body), app: app) } throws: { ($0 as? ValidationError)?.field == field }
        }
    }
}
