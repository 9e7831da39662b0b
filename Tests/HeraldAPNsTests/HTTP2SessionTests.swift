import Foundation
@testable import HeraldAPNs
import Testing

/// A server that breaks the protocol: nghttp2 accepts the bytes, answers with its own GOAWAY and ignores everything
/// after it, so the connection must see that the session is over (`isFinished`) rather than wait for answers.
@Suite struct HTTP2SessionTests {
    final class Ignored: HTTP2SessionEvents {
        func settingsReceived(maximumConcurrentStreams: Int) {}
        func pingAcknowledged() {}
        func goawayReceived(lastStreamID: Int32, errorCode: UInt32, reason: String) {}
        func responseEnded(_ request: PendingRequest) {}
        func headerReceived(_ request: PendingRequest, name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>) {}
        func dataReceived(_ request: PendingRequest, data: UnsafeBufferPointer<UInt8>) {}
        func streamClosed(_ streamID: Int32, _ ending: HTTP2StreamEnding) {}
    }

    /// Frame type of each frame in `bytes` (9-byte headers, RFC 9113 §4.1), after the client's preface if present.
    static func frameTypes(_ bytes: [UInt8]) -> [UInt8] {
        let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
        var index = bytes.starts(with: preface) ? preface.count : 0
        var types: [UInt8] = []
        while index + 9 <= bytes.count {
            let length = Int(bytes[index]) << 16 | Int(bytes[index + 1]) << 8 | Int(bytes[index + 2])
            types.append(bytes[index + 3])
            index += 9 + length
        }
        return types
    }

    @Test func aConnectionErrorFromTheServerEndsTheSessionOnceItsGoawayIsOut() throws {
        let events = Ignored()
        let session = try #require(HTTP2ClientSession(events: events))
        func feed(_ bytes: [UInt8]) -> String? { bytes.withUnsafeBufferPointer { session.receive($0) } }
        func sent() -> [UInt8] {
            var out: [UInt8] = []
            #expect(session.takeOutgoing(into: &out, limit: 65_536) == nil)
            return Self.frameTypes(out)
        }
        #expect(sent() == [4], "the client's SETTINGS")
        #expect(feed([0, 0, 0, 4, 0, 0, 0, 0, 0]) == nil, "the server's SETTINGS")
        #expect(sent() == [4], "its acknowledgement")
        #expect(!session.isFinished)
        // WINDOW_UPDATE of 0 on the connection: a connection error (RFC 9113 §6.9) that nghttp2 handles itself.
        #expect(feed([0, 0, 4, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0]) == nil)
        #expect(!session.isFinished, "its GOAWAY is still to be sent")
        #expect(sent() == [7])
        #expect(session.isFinished)
    }

    @Test func aServersGoawayWithNothingOpenEndsTheSessionToo() throws {
        let events = Ignored()
        let session = try #require(HTTP2ClientSession(events: events))
        var out: [UInt8] = []
        _ = session.takeOutgoing(into: &out, limit: 65_536)
        let settings: [UInt8] = [0, 0, 0, 4, 0, 0, 0, 0, 0]
        let goaway: [UInt8] = [0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        #expect((settings + goaway).withUnsafeBufferPointer { session.receive($0) } == nil)
        _ = session.takeOutgoing(into: &out, limit: 65_536)
        #expect(session.isFinished)
    }
}

@Suite struct SocketConnectorTests {
    @Test func addressesAlternateFamilies() {
        func address(_ family: Int32) -> SocketAddress {
            var address = SocketAddress()
            address.storage.ss_family = sa_family_t(family)
            return address
        }
        let six = Int32(AF_INET6), four = Int32(AF_INET)
        let ordered = SocketConnector.alternatingFamilies([six, six, six, four].map(address)).map(\.family)
        #expect(ordered == [six, four, six, six])
        #expect(SocketConnector.alternatingFamilies([four, six, six].map(address)).map(\.family) == [four, six, six])
    }
}
