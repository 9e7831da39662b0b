import HeraldRedis

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

/// Throws the first error reply of a pipeline (which returns error replies in place), as `command` would.
func throwFirstErrorReply(_ replies: [RedisValue]) throws {
    for case .error(let message) in replies { throw RedisError.fromReply(message) }
}
