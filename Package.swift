// swift-tools-version:6.0
import Foundation
import PackageDescription

// librdkafka ≥ 2.10 is built by scripts/setup into a prefix the project owns (Debian bookworm ships 2.0.2, which
// cannot talk to the Tansu broker used in tests; 2.4–2.9 crash when a topic comes back with a new id). Keep this default in step with scripts/lib.sh.
let environment = ProcessInfo.processInfo.environment
let depsDirectory = environment["HERALD_DEPS"] ?? ((environment["HOME"] ?? "/root") + "/.cache/herald")
let rdkafkaPrefix = depsDirectory + "/librdkafka-forky"
let rdkafkaSwift: [SwiftSetting] = [.unsafeFlags(["-Xcc", "-I\(rdkafkaPrefix)/include"])]
let rdkafkaLinker: [LinkerSetting] = [
    .unsafeFlags(["-L\(rdkafkaPrefix)/lib", "-Xlinker", "-rpath", "-Xlinker", "\(rdkafkaPrefix)/lib"]),
]

let package = Package(
    name: "Herald",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "herald-ingest", targets: ["herald-ingest"]),
        .executable(name: "herald-dispatcher", targets: ["herald-dispatcher"]),
        .executable(name: "heraldctl", targets: ["heraldctl"]),
        .executable(name: "herald-apns-sim", targets: ["herald-apns-sim"]),
        // For Fuzz/Package.swift (the libFuzzer targets), which depends on this package by path.
        .library(name: "HeraldFuzzable", targets: ["HeraldRuntime", "HeraldCrypto", "HeraldCore", "HeraldHTTP",
                                                   "HeraldAPNsSimulator"]),
    ],
    targets: [
        // C libraries, one system-library target each, and one C target of wrappers for macros and variadics.
        .systemLibrary(name: "CRdKafka", path: "Sources/CRdKafka"),
        .systemLibrary(name: "CHiredis", path: "Sources/CHiredis"),
        .systemLibrary(name: "COpenSSL", path: "Sources/COpenSSL"),
        .systemLibrary(name: "CNghttp2", path: "Sources/CNghttp2"),
        .target(name: "CHeraldShims", linkerSettings: [.linkedLibrary("ssl"), .linkedLibrary("crypto")]),

        // Logging, metrics, configuration from the environment, service lifecycle: used by everything.
        .target(name: "HeraldRuntime"),
        // Domain model and validation: apps, keys, subscriptions, registrations, jobs. No I/O.
        .target(name: "HeraldCore", dependencies: ["HeraldCrypto", "HeraldRuntime"]),
        // SHA-256, random ids, ES256 signing, ES256/RS256 verification (OpenSSL).
        .target(name: "HeraldCrypto", dependencies: ["COpenSSL", "CHeraldShims", "HeraldRuntime"]),
        // Redis client over hiredis: pool, pipelining, scripts.
        .target(name: "HeraldRedis", dependencies: ["CHiredis", "HeraldRuntime"]),
        // Kafka producer, consumer and admin over librdkafka.
        .target(name: "HeraldKafka", dependencies: ["CRdKafka", "HeraldRuntime"],
                swiftSettings: rdkafkaSwift, linkerSettings: rdkafkaLinker),
        // Our own HTTP/1.1 server (epoll loops, one per worker thread) with a small router.
        .target(name: "HeraldHTTP", dependencies: ["CHeraldShims", "HeraldRuntime"]),
        // HTTP/2 APNs client (nghttp2 + OpenSSL) with provider tokens.
        .target(name: "HeraldAPNs", dependencies: ["CNghttp2", "COpenSSL", "CHeraldShims", "HeraldCrypto",
                                                   "HeraldRuntime"]),
        // The strict APNs stand-in used by tests, benchmarks and the local stack.
        .target(name: "HeraldAPNsSimulator", dependencies: ["CNghttp2", "COpenSSL", "CHeraldShims",
                                                            "HeraldCrypto", "HeraldRuntime"]),
        // The Redis data model: subscriptions, Live Activity registrations, rate limits, idempotency.
        .target(name: "HeraldStore", dependencies: ["HeraldCore", "HeraldRedis", "HeraldCrypto", "HeraldRuntime"]),
        // herald-ingest's HTTP API.
        .target(name: "HeraldIngest", dependencies: ["HeraldCore", "HeraldHTTP", "HeraldStore", "HeraldRedis", "HeraldKafka",
                                                     "HeraldCrypto", "HeraldRuntime"],
                swiftSettings: rdkafkaSwift),
        // herald-dispatcher: jobs → APNs.
        .target(name: "HeraldDispatcher", dependencies: ["CHeraldShims", "HeraldCore", "HeraldStore", "HeraldRedis", "HeraldKafka", "HeraldAPNs",
                                                         "HeraldCrypto", "HeraldHTTP", "HeraldRuntime"],
                swiftSettings: rdkafkaSwift),

        .executableTarget(name: "herald-ingest", dependencies: ["HeraldIngest", "HeraldCore", "HeraldKafka", "HeraldRedis",
                                                                "HeraldRuntime"],
                          swiftSettings: rdkafkaSwift),
        .executableTarget(name: "herald-dispatcher", dependencies: ["HeraldDispatcher", "HeraldRuntime"],
                          swiftSettings: rdkafkaSwift),
        .executableTarget(name: "heraldctl", dependencies: ["HeraldCore", "HeraldKafka", "HeraldRedis", "HeraldStore",
                                                            "HeraldCrypto", "HeraldRuntime"],
                          swiftSettings: rdkafkaSwift),
        .executableTarget(name: "herald-apns-sim", dependencies: ["HeraldAPNsSimulator", "HeraldRuntime"]),
        // The HTTP server alone, measured against nginx by scripts/bench-http.
        .executableTarget(name: "herald-bench-http", dependencies: ["HeraldHTTP", "HeraldRuntime"]),
        // Producer throughput through HeraldKafka (scripts/bench-kafka compares it with a reference producer).
        .executableTarget(name: "herald-bench-kafka", dependencies: ["HeraldKafka", "HeraldRuntime"],
                          swiftSettings: rdkafkaSwift),
        // APNs client throughput against nghttpd, compared with h2load (scripts/bench-apns).
        .executableTarget(name: "herald-bench-apns", dependencies: ["HeraldAPNs", "HeraldCrypto", "HeraldRuntime"]),
        // Seeds channels and produces jobs for scripts/bench-dispatcher (fan-out rate and end-to-end latency).
        .executableTarget(name: "herald-bench-dispatcher", dependencies: ["HeraldCore", "HeraldStore", "HeraldRedis",
                                                                          "HeraldKafka", "HeraldRuntime"],
                          swiftSettings: rdkafkaSwift),

        // Load generator comparing HeraldRedis with redis-benchmark (scripts/bench-redis).
        .executableTarget(name: "herald-bench-redis", dependencies: ["HeraldRedis", "HeraldRuntime"]),

        // Mixed load and push accounting for scripts/soak (the long-running reliability check of issue #10).
        .executableTarget(name: "herald-soak", dependencies: ["HeraldTestSupport", "HeraldKafka", "HeraldRuntime"],
                          swiftSettings: rdkafkaSwift),

        // Helpers shared by the test targets: a raw HTTP/1.1 client, apps files with fresh keys, schema checks.
        .target(name: "HeraldTestSupport", dependencies: ["HeraldCore", "HeraldCrypto", "HeraldRuntime"]),

        .testTarget(name: "HeraldRuntimeTests", dependencies: ["HeraldRuntime"]),
        .testTarget(name: "HeraldCoreTests", dependencies: ["HeraldCore", "HeraldTestSupport"]),
        .testTarget(name: "HeraldCryptoTests", dependencies: ["HeraldCrypto", "HeraldRuntime"]),
        .testTarget(name: "HeraldRedisTests", dependencies: ["HeraldRedis", "HeraldHTTP", "HeraldTestSupport", "HeraldRuntime"]),
        .testTarget(name: "HeraldKafkaTests", dependencies: ["HeraldKafka", "CRdKafka", "HeraldTestSupport"],
                    swiftSettings: rdkafkaSwift),
        .testTarget(name: "HeraldStoreTests", dependencies: ["HeraldStore", "HeraldCrypto", "HeraldTestSupport"]),
        .testTarget(name: "HeraldHTTPTests", dependencies: ["HeraldHTTP", "HeraldTestSupport"]),
        .testTarget(name: "HeraldAPNsTests", dependencies: ["HeraldAPNs", "HeraldAPNsSimulator", "HeraldCrypto",
                                                   "HeraldRuntime"]),
        .testTarget(name: "HeraldAPNsSimulatorTests", dependencies: ["HeraldAPNsSimulator", "HeraldCrypto",
                                                                     "HeraldRuntime"]),
        .testTarget(name: "HeraldIngestTests", dependencies: ["HeraldIngest", "HeraldTestSupport", "HeraldKafka",
                                                     "HeraldRedis", "HeraldStore"],
                    swiftSettings: rdkafkaSwift),
        .testTarget(name: "HeraldCtlTests", dependencies: ["HeraldCore", "HeraldKafka", "HeraldRedis", "HeraldStore",
                                                   "HeraldTestSupport", "HeraldRuntime"],
                    swiftSettings: rdkafkaSwift),
        .testTarget(name: "HeraldDispatcherTests", dependencies: ["HeraldDispatcher", "HeraldTestSupport", "HeraldAPNsSimulator",
                                                         "HeraldStore", "HeraldKafka", "HeraldRedis", "HeraldAPNs",
                                                         "HeraldCore", "HeraldCrypto", "HeraldRuntime"],
                    swiftSettings: rdkafkaSwift),
        .testTarget(name: "HeraldReliabilityTests", dependencies: ["HeraldTestSupport", "HeraldCore", "HeraldCrypto",
                                                          "HeraldRedis", "HeraldKafka", "HeraldStore",
                                                          "HeraldRuntime", "HeraldAPNsSimulator", "HeraldHTTP"],
                    swiftSettings: rdkafkaSwift),
    ],
    swiftLanguageModes: [.v6]
)
