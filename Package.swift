// swift-tools-version:6.0
import PackageDescription

// Linux only (epoll, /proc, glibc's malloc tunables): no `platforms`. The benchmark tools and the soak's load
// generator are in Benchmarks/Package.swift and the libFuzzer targets in Fuzz/Package.swift, both depending on
// this package by path, so `swift build` builds the four executables and their libraries.
let package = Package(
    name: "Herald",
    products: [
        .executable(name: "herald-ingest", targets: ["herald-ingest"]),
        .executable(name: "herald-dispatcher", targets: ["herald-dispatcher"]),
        .executable(name: "heraldctl", targets: ["heraldctl"]),
        .executable(name: "herald-apns-sim", targets: ["herald-apns-sim"]),
        // For Fuzz/Package.swift (the libFuzzer targets), which depends on this package by path.
        .library(name: "HeraldFuzzable", targets: ["HeraldRuntime", "HeraldCrypto", "HeraldCore", "HeraldHTTP",
                                                   "HeraldAPNsSimulator"]),
        // For Benchmarks/Package.swift (load generators and the soak), likewise.
        .library(name: "HeraldBenchmarkable", targets: ["HeraldRuntime", "HeraldCrypto", "HeraldCore", "HeraldRedis",
                                                        "HeraldKafka", "HeraldHTTP", "HeraldAPNs", "HeraldStore"]),
    ],
    targets: [
        // C libraries, one system-library target each, and one C target of wrappers for macros and variadics.
        // librdkafka ≥ 2.10 (scripts/setup builds it into /usr/local: bookworm's 2.0.2 cannot talk to Tansu, and
        // 2.4–2.9 crash when a topic comes back with a new id).
        .systemLibrary(name: "CRdKafka", path: "Sources/CRdKafka", pkgConfig: "rdkafka",
                       providers: [.apt(["librdkafka-dev"])]),
        .systemLibrary(name: "CHiredis", path: "Sources/CHiredis"),
        .systemLibrary(name: "COpenSSL", path: "Sources/COpenSSL"),
        .systemLibrary(name: "CNghttp2", path: "Sources/CNghttp2"),
        .target(name: "CHeraldShims", linkerSettings: [.linkedLibrary("ssl"), .linkedLibrary("crypto")]),

        // Logging, metrics, configuration from the environment, service lifecycle: used by everything.
        .target(name: "HeraldRuntime", dependencies: ["CHeraldShims"]),
        // APNs vocabulary without a transport (environment, push type, priority), shared by the domain model
        // and the APNs client.
        .target(name: "HeraldAPNsCore"),
        // Domain model and validation: apps, keys, subscriptions, registrations, jobs. No I/O.
        .target(name: "HeraldCore", dependencies: ["HeraldAPNsCore", "HeraldCrypto", "HeraldRuntime"]),
        // SHA-256, random ids, ES256 signing, ES256/RS256 verification (OpenSSL).
        .target(name: "HeraldCrypto", dependencies: ["COpenSSL", "CHeraldShims", "HeraldRuntime"]),
        // Redis client (hiredis' reply parser over our own sockets, in clear or TLS): pool, pipelining, scripts.
        .target(name: "HeraldRedis", dependencies: ["CHiredis", "HeraldTLS", "HeraldRuntime"]),
        // Kafka producer, consumer and admin over librdkafka.
        .target(name: "HeraldKafka", dependencies: ["CRdKafka", "HeraldRuntime"]),
        // Our own HTTP/1.1 server (epoll loops, one per worker thread) with a small router.
        .target(name: "HeraldHTTP", dependencies: ["CHeraldShims", "HeraldRuntime"]),
        // TLS over non-blocking sockets (OpenSSL), for the APNs client, the simulator and the Redis client.
        .target(name: "HeraldTLS", dependencies: ["COpenSSL", "CHeraldShims", "HeraldCrypto", "HeraldRuntime"]),
        // HTTP/2 APNs client (nghttp2 + HeraldTLS) with provider tokens.
        .target(name: "HeraldAPNs", dependencies: ["CNghttp2", "CHeraldShims", "HeraldAPNsCore", "HeraldTLS",
                                                   "HeraldCrypto", "HeraldRuntime"]),
        // The strict APNs stand-in used by tests, benchmarks and the local stack.
        .target(name: "HeraldAPNsSimulator", dependencies: ["CNghttp2", "COpenSSL", "CHeraldShims", "HeraldTLS",
                                                            "HeraldCrypto", "HeraldRuntime"]),
        // The Redis data model: subscriptions, Live Activity registrations, rate limits, idempotency.
        .target(name: "HeraldStore", dependencies: ["HeraldCore", "HeraldRedis", "HeraldCrypto", "HeraldRuntime"]),
        // herald-ingest's HTTP API.
        .target(name: "HeraldIngest", dependencies: ["HeraldCore", "HeraldHTTP", "HeraldStore", "HeraldRedis", "HeraldKafka",
                                                     "HeraldCrypto", "HeraldRuntime"]),
        // herald-dispatcher: jobs → APNs.
        .target(name: "HeraldDispatcher", dependencies: ["CHeraldShims", "HeraldCore", "HeraldStore", "HeraldRedis", "HeraldKafka", "HeraldAPNs",
                                                         "HeraldCrypto", "HeraldHTTP", "HeraldRuntime"]),

        .executableTarget(name: "herald-ingest", dependencies: ["HeraldIngest", "HeraldCore", "HeraldKafka", "HeraldRedis",
                                                                "HeraldRuntime"]),
        .executableTarget(name: "herald-dispatcher", dependencies: ["HeraldDispatcher", "HeraldRuntime"]),
        .executableTarget(name: "heraldctl", dependencies: ["HeraldCore", "HeraldKafka", "HeraldRedis", "HeraldStore",
                                                            "HeraldCrypto", "HeraldRuntime", "HeraldAPNs",
                                                            "HeraldDispatcher"]),
        .executableTarget(name: "herald-apns-sim", dependencies: ["HeraldAPNsSimulator", "HeraldRuntime"]),

        // Helpers shared by the test targets (a raw HTTP/1.1 client, apps files with fresh keys, child processes,
        // schema checks): a test target, so `swift build` leaves it out. Benchmarks/ builds the same folder.
        .testTarget(name: "HeraldTestSupport", dependencies: ["HeraldCore", "HeraldCrypto", "HeraldRuntime"]),

        .testTarget(name: "HeraldRuntimeTests", dependencies: ["HeraldRuntime"]),
        .testTarget(name: "HeraldCoreTests", dependencies: ["HeraldCore", "HeraldTestSupport"]),
        .testTarget(name: "HeraldCryptoTests", dependencies: ["HeraldCrypto", "HeraldRuntime"]),
        .testTarget(name: "HeraldRedisTests", dependencies: ["HeraldRedis", "HeraldHTTP", "HeraldCrypto", "HeraldTestSupport",
                                                          "HeraldRuntime"]),
        .testTarget(name: "HeraldKafkaTests", dependencies: ["HeraldKafka", "CRdKafka", "HeraldRuntime", "HeraldTestSupport"]),
        .testTarget(name: "HeraldStoreTests", dependencies: ["HeraldStore", "HeraldCrypto", "HeraldTestSupport"]),
        .testTarget(name: "HeraldHTTPTests", dependencies: ["HeraldHTTP", "HeraldTestSupport"]),
        .testTarget(name: "HeraldAPNsTests", dependencies: ["HeraldAPNs", "HeraldAPNsSimulator", "HeraldCrypto",
                                                   "HeraldRuntime"]),
        .testTarget(name: "HeraldAPNsSimulatorTests", dependencies: ["HeraldAPNsSimulator", "HeraldCrypto",
                                                                     "HeraldRuntime"]),
        .testTarget(name: "HeraldIngestTests", dependencies: ["HeraldIngest", "HeraldTestSupport", "HeraldKafka",
                                                     "HeraldRedis", "HeraldStore"]),
        .testTarget(name: "HeraldCtlTests", dependencies: ["HeraldCore", "HeraldKafka", "HeraldRedis", "HeraldStore",
                                                   "HeraldTestSupport", "HeraldRuntime"]),
        .testTarget(name: "HeraldDispatcherTests", dependencies: ["HeraldDispatcher", "HeraldTestSupport", "HeraldAPNsSimulator",
                                                         "HeraldStore", "HeraldKafka", "HeraldRedis", "HeraldAPNs",
                                                         "HeraldCore", "HeraldCrypto", "HeraldRuntime"]),
        .testTarget(name: "HeraldReliabilityTests", dependencies: ["HeraldTestSupport", "HeraldCore", "HeraldCrypto",
                                                          "HeraldRedis", "HeraldKafka", "HeraldStore", "HeraldAPNs",
                                                          "HeraldRuntime", "HeraldAPNsSimulator", "HeraldHTTP"]),
    ],
    swiftLanguageModes: [.v6]
)
