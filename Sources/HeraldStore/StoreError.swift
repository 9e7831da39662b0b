/// Why a store call failed, beyond Redis's own errors.
public enum StoreError: Error, CustomStringConvertible {
    case unexpectedReply(String)
    /// A new subscription past the device's cap.
    case tooManySubscriptions(Int)

    public var description: String {
        switch self {
        case .unexpectedReply(let what): "unexpected Redis reply to \(what)"
        case .tooManySubscriptions(let cap): "the device already has \(cap) subscriptions"
        }
    }
}
