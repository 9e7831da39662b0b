// swift-tools-version:6.0
// Herald's load generators and the soak's load and accounting, kept out of the product: the scripts in
// Benchmarks/scripts build them (release, scratch path .build/benchmarks of the root).
import PackageDescription

let herald = Target.Dependency.product(name: "HeraldBenchmarkable", package: "Herald")

let package = Package(
    name: "HeraldBenchmarks",
    dependencies: [.package(name: "Herald", path: "..")],
    targets: [
        // The root's test helpers (a symlink to Tests/HeraldTestSupport: one copy of the source), for the soak.
        .target(name: "HeraldTestSupport", dependencies: [herald]),
        // The HTTP server alone, measured against nginx (bench-http).
        .executableTarget(name: "herald-bench-http", dependencies: [herald]),
        // Producer throughput through HeraldKafka, against librdkafka's and Python's producers (bench-kafka).
        .executableTarget(name: "herald-bench-kafka", dependencies: [herald]),
        // APNs client throughput, against h2load (bench-apns).
        .executableTarget(name: "herald-bench-apns", dependencies: [herald]),
        // Seeds channels and produces jobs for the dispatcher's fan-out and latency runs (bench-dispatcher).
        .executableTarget(name: "herald-bench-dispatcher", dependencies: [herald]),
        // HeraldRedis against redis-benchmark (bench-redis).
        .executableTarget(name: "herald-bench-redis", dependencies: [herald]),
        // Mixed load and push accounting for the soak (soak).
        .executableTarget(name: "herald-soak", dependencies: [herald, "HeraldTestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)
