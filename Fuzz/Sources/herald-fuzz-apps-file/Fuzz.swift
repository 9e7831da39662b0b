import Foundation
import HeraldCore
import HeraldCrypto
import HeraldFuzzSupport

/// The apps-file parser (`HERALD_APPS_FILE`, reloaded on SIGHUP): a file becomes a whole, checked directory or
/// an error. Key files named `es256.p8`, `es256.pem` and `rsa.pem` exist; any other name is missing.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Data(UnsafeBufferPointer(start: data, count: size))
    let directory: AppDirectory
    do { directory = try AppDirectory.parse(bytes, readFile: FuzzKeys.file) } catch {
        require(error is AppsFileError, "unexpected \(error)")
        return 0
    }
    for (id, app) in directory.apps {
        require(app.id == id, "app \(app.id) filed under \(id)")
        require(!id.isEmpty && id.utf8.count <= 64, "app id \(id)")
        for key in app.keys {
            require(key.sha256.utf8.count == 64 && key.sha256 == key.sha256.lowercased(), "key hash \(key.sha256)")
        }
        require(app.apns.teamId.utf8.count == 10 && app.apns.keyId.utf8.count == 10, "apns ids")
        if let oauth = app.oauth {
            require(directory.app(forIssuer: oauth.issuer)?.id == id, "issuer \(oauth.issuer) maps to another app")
        }
    }
    // A key authenticates only for the app that lists its hash, with that entry's kind. (libFuzzer sees the hash
    // lookup's comparisons and can copy a probe's hash into the file, so a probe may be listed.)
    let probe = "hrd_pub_" + String(decoding: bytes.prefix(32), as: UTF8.self)
    if let principal = directory.authenticate(apiKey: probe) {
        let hash = SHA256.hex(probe)
        let listed = directory.apps[principal.appID]?.keys.first { $0.sha256 == hash }
        require(listed?.kind == principal.kind && principal.rateLimitKey == "key:" + hash,
                "key authenticated for app \(principal.appID), which does not list it")
    }
    return 0
}
