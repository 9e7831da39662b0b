import HeraldCore
import HeraldRuntime

/// `heraldctl keys new`: a fresh API key and the apps-file entry that accepts it; `heraldctl keys new-secret`: a
/// fresh shared secret (job signing, channel grants) to store in a file.
enum KeysCommand {
    static func new(_ flags: Flags) throws {
        guard let app = flags["app"] else { throw ConfigurationError("--app", "is required") }
        guard let kind = flags["kind"].flatMap(APIKeyKind.init(rawValue:)) else {
            throw ConfigurationError("--kind", "must be public or secret")
        }
        let key = NewAPIKey.generate(kind: kind)
        var entry = "{\"kind\": \"\(kind.rawValue)\", \"sha256\": \"\(key.sha256)\""
        if let user = flags["user"] { entry += ", \"user\": \(JSONText.quoted(user))" }
        entry += "}"
        print("""
            key:   \(key.key)
            Give the key to the \(kind == .public ? "app (device endpoints)" : "producer (all endpoints)"); it is not stored anywhere.
            Add this entry to the "keys" of app "\(app)" in the apps file, then send SIGHUP to the services:
              \(entry)
            """)
    }

    static func newSecret() {
        // Only the secret on stdout, so `heraldctl keys new-secret > keys/shop-jobs.secret` makes the file.
        print(SharedSecret.generateText())
    }
}
