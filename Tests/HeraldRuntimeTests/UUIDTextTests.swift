import Foundation
import HeraldRuntime
import Testing

@Suite struct UUIDTextTests {
    @Test("a UUID's text is Foundation's, in lowercase, and written where it is asked")
    func matchesFoundation() {
        for uuid in [UUID(), UUID(), UUID(uuid: (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 255))] {
            #expect(UUIDText.string(uuid) == uuid.uuidString.lowercased())
        }
        var buffer = [UInt8](repeating: UInt8(ascii: "."), count: 40)
        let uuid = UUID()
        buffer.withUnsafeMutableBufferPointer { UUIDText.write(uuid, to: $0, at: 2) }
        #expect(String(decoding: buffer, as: UTF8.self) == ".." + uuid.uuidString.lowercased() + "..")
    }
}
