import HeraldRuntime

/// The topic each device token was first pushed to. APNs issues a token to one app and push type (a Live Activity
/// token is not the app's device token), so a later push of the token to another topic gets 400
/// DeviceTokenNotForTopic. Remembers up to `limit` tokens; tokens beyond it are not bound, so memory stays bounded.
final class TokenTopicBook: Sendable {
    private struct Book {
        /// Token's hash → index into `topics` (a handful of topics are shared by every token). Hashes rather than
        /// the tokens keep a million entries to tens of MB; a collision between two tokens is a ~1e-8 chance.
        var tokens: [Int: Int32] = [:]
        var topics: [String] = []
        var topicIndex: [String: Int] = [:]
    }

    private let book = Lock(Book())
    private let limit: Int

    init(limit: Int) { self.limit = limit }

    /// False when `token` is bound to a topic other than `topic`; else binds it (if there is room) and returns true.
    func bind(_ token: String, to topic: String) -> Bool {
        book.withLock { book in
            let hash = token.hashValue
            if let bound = book.tokens[hash] { return book.topics[Int(bound)] == topic }
            guard book.tokens.count < limit else { return true }
            let index: Int
            if let known = book.topicIndex[topic] {
                index = known
            } else {
                index = book.topics.count
                book.topics.append(topic)
                book.topicIndex[topic] = index
            }
            book.tokens[hash] = Int32(index)
            return true
        }
    }
}
