import Foundation
import HeraldCore
import HeraldCrypto
import HeraldRuntime

/// Fixed keys and an app for the fuzz targets, so seed inputs can carry tokens these keys signed. Generated for
/// fuzzing only: they protect nothing.
public enum FuzzKeys {
    public static let es256PrivatePEM = """
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg914wDIpeuM1pY5eb
IlZ8m6sL4cm3dweVtWSZkx89J3ShRANCAAThb60UsUg1Y2A8YgSazCp1DpTq1MkC
kWoHAxXti1t/nJWgoaNJNWgYg12f2BcWhhzEw/fI4CHByO9x3dumv4xH
-----END PRIVATE KEY-----
"""
    public static let es256PublicPEM = """
-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE4W+tFLFINWNgPGIEmswqdQ6U6tTJ
ApFqBwMV7Ytbf5yVoKGjSTVoGINdn9gXFoYcxMP3yOAhwcjvcd3bpr+MRw==
-----END PUBLIC KEY-----
"""
    public static let rsaPrivatePEM = """
-----BEGIN PRIVATE KEY-----
MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDMUngDmMyCdsEd
SiuwnWMbR/kXk8iwIqGkK5BDCHYd7cZ3Lq1xNjQQnreY9RNDRhy0g5fcX8Du9/DE
NR/q/W1447SityFbt1s5JoD2qLyozj3o9Nqt5iIyyK4E1gLof1nW10d9hYsk0wIR
zIldJyqGj2J3BfhQ5ZPxm0R3iTXJ8+nebAJ0nFzemAuhSWT4rdtdusrB8AuQd5yC
lqaHMF+lX3QCFD3hO+UcqNeeIBxabJztzN/XSEaAu0h2GmP6zpMspLaia5lX5ZrS
sZb9PhfdboI6s31nbqACTQT+qCsWkTzBQ0pioyMG4lMQJyFJvODG7HEU7RYR4zKm
8iYWxZe5AgMBAAECggEADMTnprPlLg8dZQb2YYiIgdM27EQKYgWcC/5D+wh7l0W9
pkOmx8E/Mj21FCxWypjGYPqrYjSiwlyA8cYvKziw34H9j0C6Jzj3jMQNAb1MYxFW
mak5xG3yO7HCfF9imaSh2PUlzOCscD32rmWVvRpeREAQQ4d+PBII86vENONAlxEY
eX2+Ghwbhs4UPtHbuy/qDYObJJSvgXNSaHl+NHXovO6EX0YC+NE7ggAA5HfzPL22
Pd2G+pI2LGlvIhC3njFfcL06utPt5BIE7VHdKV9Sx32M6chQQJ7KStaU4wIlNw4o
C0UT0Atvs5Ha+/496UsyqoeQSStFs5egAD587Mf27QKBgQDmWnpgCMlBYa6Jb194
VNjWV/Gm8Mr5UnCljpOzldzzECezAi4kcZabyLKdsCn9tpECHHYGCIYxWE8Nceo7
03wNqs3s5EhFz1IM71SWTDTRMkuFAdc+JAB6E9tr6ddAw6TG+2GSmq1B2drN/zYN
7X2Ph2wOY+jYQhPkRZ+lj52BzQKBgQDjEgxhWSt2r7ycr/I79FfzOqdsx0updjaZ
9dCPSIL2Jenu6/elyJNn2Lgerfujbt+XKAvnIWRTx2z+Tz+5dwfqNZ7hXZdF2F49
GK0uPfe39+LpwzrILqEkIFxlJpCtvsQzjgbnCr7wYStswvw9EFRiOCCYJiEkVZQr
9uEEDOfxnQKBgDMIQmo6KBQDBv7NnLH04iECVLfuSplXqTsUTiaQAeYbYyAmUICk
ZYBXwzJqD7N0mcWE9qS5iLkv3juVTBY68RW6DGr53AUTPBM/hlbRxTW/Vbm+waez
pCNneMn8gUKI1V173Y70E4QuNmpCqwAE6Dc/AjJh8fjPEscUoZy1J2jVAoGBAMLZ
IPCEIOzGnlXiET3rTXE1GqgYWE/BVddFfUMGmQJ5xES2DZsgA4VwDYaeCznSEWFX
Bue92qadkWSkQm12u775Zi3DLuTLZwqMW0c7+47M0tV/JrjScopajo5pymqdMSWA
MWIe8Xu6FhZNNz96/L4PpcCJr5TLLsuPHMVqAbptAoGASbB1WcwtvaNGEgcOeKUY
EV5NKmIZ4zBIexNfHekQ2K12PgizABhhql52T6A7CFRVX3Ot7XFVwPPeSjE1j4YV
IlClQG7NNbp0SZ+5YDMt4AUwJGxaaykW9N0unHw5RZK2ju4YpEExFps3Kdh2YKlq
kV3dtdhQ97uk141Hd8DYB2E=
-----END PRIVATE KEY-----
"""
    public static let rsaPublicPEM = """
-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAzFJ4A5jMgnbBHUorsJ1j
G0f5F5PIsCKhpCuQQwh2He3Gdy6tcTY0EJ63mPUTQ0YctIOX3F/A7vfwxDUf6v1t
eOO0orchW7dbOSaA9qi8qM496PTareYiMsiuBNYC6H9Z1tdHfYWLJNMCEcyJXScq
ho9idwX4UOWT8ZtEd4k1yfPp3mwCdJxc3pgLoUlk+K3bXbrKwfALkHecgpamhzBf
pV90AhQ94TvlHKjXniAcWmyc7czf10hGgLtIdhpj+s6TLKS2omuZV+Wa0rGW/T4X
3W6COrN9Z26gAk0E/qgrFpE8wUNKYqMjBuJTECchSbzgxuxxFO0WEeMypvImFsWX
uQIDAQAB
-----END PUBLIC KEY-----
"""
    public static let es256 = try! PrivateKey(pem: es256PrivatePEM)
    public static let rsa = try! PrivateKey(pem: rsaPrivatePEM)

    /// Key files by the names an apps file may use: the ES256 `.p8`, its public half and the RSA public key.
    public static func file(_ name: String) throws -> String {
        switch name {
        case "es256.p8": return es256PrivatePEM
        case "es256.pem": return es256PublicPEM
        case "rsa.pem": return rsaPublicPEM
        default: throw CocoaError(.fileNoSuchFile)
        }
    }

    /// One app, `app1`: `com.example.app` with the ES256 APNs key and an RS256 OAuth issuer
    /// (`https://auth.example.com`, audience `herald`), as an apps file gives it.
    public static let directory: AppDirectory = {
        let text = #"{"apps": [{"id": "app1", "keys": [], "apns": {"teamId": "TEAM123456", "keyId": "KEY1234567", "#
            + #""privateKeyPath": "es256.p8", "bundleId": "com.example.app"}, "oauth": {"issuer": "https://auth.example.com", "#
            + #""audience": "herald", "publicKeyPath": "rsa.pem"}}]}"#
        return try! AppDirectory.parse(Data(text.utf8), readFile: Self.file)
    }()

    public static var app: App { directory.apps["app1"]! }
}

/// The fuzzer's input split at the first `count` newlines: path parameters or headers, then the body.
public func lines(_ bytes: [UInt8], _ count: Int) -> (heads: [String], body: [UInt8]) {
    var heads: [String] = []
    var rest = bytes[...]
    while heads.count < count, let newline = rest.firstIndex(of: UInt8(ascii: "\n")) {
        heads.append(String(decoding: rest[..<newline], as: UTF8.self))
        rest = rest[(newline + 1)...]
    }
    while heads.count < count { heads.append("") }
    return (heads, Array(rest))
}

/// Stops the fuzzer with `message` when an invariant does not hold (a crash libFuzzer records with its input).
public func require(_ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String) {
    if !condition() { fatalError("invariant broken: \(message())") }
}
