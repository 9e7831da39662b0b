extension UInt8 {
    /// An ASCII hex digit, either case: push tokens, hashes and ids are checked and masked by it.
    public var isHexDigit: Bool {
        (0x30...0x39).contains(self) || (0x41...0x46).contains(self) || (0x61...0x66).contains(self)
    }
}
