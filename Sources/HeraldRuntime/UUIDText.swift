import Foundation

/// A UUID as lowercase text, 8-4-4-4-12. Foundation's `uuidString` formats with `sprintf` and in upper case,
/// which cost a few percent of the CPU wherever it ran once per push or per event.
public enum UUIDText {
    public static let count = 36

    /// Writes the text of `uuid` into `out` from `start`; `out` must have 36 bytes from there.
    public static func write(_ uuid: UUID, to out: UnsafeMutableBufferPointer<UInt8>, at start: Int) {
        withUnsafeBytes(of: uuid.uuid) { bytes in
            var index = start
            for (position, byte) in bytes.enumerated() {
                if position == 4 || position == 6 || position == 8 || position == 10 {
                    out[index] = UInt8(ascii: "-")
                    index += 1
                }
                out[index] = hexDigits[Int(byte >> 4)]
                out[index + 1] = hexDigits[Int(byte & 0x0f)]
                index += 2
            }
        }
    }

    public static func string(_ uuid: UUID) -> String {
        String(unsafeUninitializedCapacity: count) { out in
            write(uuid, to: out, at: 0)
            return count
        }
    }

    private static let hexDigits: [UInt8] = Array("0123456789abcdef".utf8)
}

extension UUID {
    /// The UUID of the first 16 of `bytes` (a hash or random bytes whose version bits the caller has set).
    public init(bytes: [UInt8]) {
        precondition(bytes.count >= 16, "a UUID needs 16 bytes")
        self.init(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                         bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
    }
}
