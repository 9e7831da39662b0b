// swift-tools-version:5.4
// Tools 5.4 on purpose: from 5.5 SwiftPM renames an executable's `main` for testing and links with
// `--defsym main=<target>_main`, which breaks a libFuzzer binary (libFuzzer brings `main`, the target has none).
import PackageDescription

let targets = ["json", "subscriptions", "activities", "events", "push-job", "dead-letter", "apps-file", "jwt",
               "provider-token", "http"]

let package = Package(
    name: "HeraldFuzz",
    platforms: [.macOS("15.0")],
    products: targets.map { .executable(name: "herald-fuzz-\($0)", targets: ["herald-fuzz-\($0)"]) },
    dependencies: [.package(name: "Herald", path: "..")],
    targets: [
        .target(name: "HeraldFuzzSupport", dependencies: [.product(name: "HeraldFuzzable", package: "Herald")]),
    ] + targets.map {
        .executableTarget(name: "herald-fuzz-\($0)", dependencies: ["HeraldFuzzSupport",
                                                                    .product(name: "HeraldFuzzable", package: "Herald")])
    }
)
