import Foundation
import HeraldAPNsSimulator
import HeraldCrypto
import HeraldRuntime
import Testing

/// The built `herald-apns-sim` next to the test bundle (`swift build --build-tests` builds it).
func simulatorExecutable() throws -> String {
    let directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    var candidates = [directory.appendingPathComponent("herald-apns-sim").path]
    if directory.pathExtension == "xctest" {
        candidates.append(directory.deletingLastPathComponent().appendingPathComponent("herald-apns-sim").path)
    }
    if let found = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) { return found }
    Issue.record("herald-apns-sim is not built next to the tests (looked at \(candidates)); run swift build --build-tests")
    throw POSIXError(.ENOENT)
}

@Suite("herald-apns-sim executable")
struct ExecutableTests {
    @Test("--help prints usage and exits 0; bad configuration exits 2 with one line")
    func helpAndBadConfiguration() async throws {
        let executable = try simulatorExecutable()
        let help = try await run(executable, ["--help"])
        #expect(help.status == 0)
        #expect(help.stdout.contains("--tls-dir"))
        #expect(help.stdout.contains("HERALD_SIM_RULES_FILE"))
        // The rules file's example in the help is a valid rules file.
        let example = try #require(help.stdout.range(of: "Example: ").map { help.stdout[$0.upperBound...] })
        let rules = try SimulatorRule.parse(Data(example.utf8))
        #expect(rules.count == 3 && rules[0].status == 410 && rules[1].times == 2 && rules[2].delayMilliseconds == 40)

        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let noKeys = try await run(executable, ["--tls-dir", directory + "/tls", "--listen", "127.0.0.1:0"])
        #expect(noKeys.status == 2)
        #expect(noKeys.stderr.split(separator: "\n").last?.contains("configuration error") == true)
        let badKey = try await run(executable, ["--tls-dir", directory + "/tls", "--key", "TEAM:missing"])
        #expect(badKey.status == 2)
        #expect(badKey.stderr.contains("TEAMID:KEYID:PATH"))
        let unknown = try await run(executable, ["--bogus", "1"])
        #expect(unknown.status == 2)
        try "{\"rules\": [{\"status\": 999}]}".write(toFile: directory + "/rules.json", atomically: true, encoding: .utf8)
        let key = try PrivateKey.generateP256()
        try key.pem.write(toFile: directory + "/key.p8", atomically: true, encoding: .utf8)
        let badRules = try await run(executable, ["--tls-dir", directory + "/tls", "--key",
                                                  "\(teamID):\(keyID):\(directory)/key.p8",
                                                  "--rules", directory + "/rules.json"])
        #expect(badRules.status == 2)
        #expect(badRules.stderr.contains("status must be 400...599"))
        for delay in ["-5", "60-20", "fast", "1-2-3", "60001"] {
            let badDelay = try await run(executable, ["--tls-dir", directory + "/tls", "--key",
                                                      "\(teamID):\(keyID):\(directory)/key.p8", "--delay-ms", delay])
            #expect(badDelay.status == 2, "--delay-ms \(delay)")
            #expect(badDelay.stderr.contains("HERALD_SIM_DELAY_MS"), "--delay-ms \(delay)")
        }
    }

    @Test("certs writes a CA and a server certificate for 127.0.0.1 and localhost")
    func certs() async throws {
        let executable = try simulatorExecutable()
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let result = try await run(executable, ["certs", "--out", directory])
        #expect(result.status == 0)
        let files = SimulatorCertificates.Files(directory: directory)
        #expect(files.exist)
        let text = try await run("/usr/bin/openssl", ["x509", "-in", files.serverCertificate, "-noout", "-text"])
        #expect(text.stdout.contains("DNS:localhost"))
        #expect(text.stdout.contains("IP Address:127.0.0.1"))
        #expect(text.stdout.contains("TLS Web Server Authentication"))
        let verify = try await run("/usr/bin/openssl", ["verify", "-CAfile", files.caCertificate, files.serverCertificate])
        #expect(verify.status == 0)
        let mode = try FileManager.default.attributesOfItem(atPath: files.serverKey)[.posixPermissions] as? Int
        #expect(mode == 0o600)
    }

    @Test("serves from HERALD_SIM_* settings, records pushes, and stops cleanly on SIGTERM")
    func serveAndStop() async throws {
        let executable = try simulatorExecutable()
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let key = try PrivateKey.generateP256()
        try key.pem.write(toFile: directory + "/key.p8", atomically: true, encoding: .utf8)
        try #"{"keys": [{"teamId": "\#(teamID)", "keyId": "\#(keyID)", "path": "key.p8"}], "topics": ["\#(bundleID)"]}"#
            .write(toFile: directory + "/sim.json", atomically: true, encoding: .utf8)

        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.environment = ProcessInfo.processInfo.environment.merging([
            "HERALD_SIM_ADDR": "127.0.0.1:0", "HERALD_SIM_TLS_DIR": directory + "/tls",
            "HERALD_SIM_CONFIG_FILE": directory + "/sim.json", "HERALD_SIM_RECORD_FILE": directory + "/pushes.jsonl",
        ]) { _, new in new }
        _ = FileManager.default.createFile(atPath: directory + "/stderr", contents: nil)
        process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: directory + "/stderr"))
        process.standardOutput = FileHandle.nullDevice
        let exited = AsyncStream<Void>.makeStream()
        process.terminationHandler = { _ in exited.continuation.finish() }
        try process.run()
        defer { if process.isRunning { process.terminate() } }

        // The log's "listening" line names the port it picked.
        var port: UInt16?
        let deadline = ContinuousClock.now + .seconds(10)
        while port == nil, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(50))
            let log = (try? String(contentsOfFile: directory + "/stderr", encoding: .utf8)) ?? ""
            for line in log.split(separator: "\n") {
                guard let object = try? JSONDecoder().decode(JSONValue.self, from: Data(line.utf8)),
                      object["msg"]?.stringValue == "listening", let address = object["sim.addr"]?.stringValue else { continue }
                port = HostPort(address)?.port
            }
        }
        let listening = try #require(port)

        let token = deviceToken()
        let jwt = try JSONWebToken.sign(claims: ["iss": .string(teamID), "iat": .number(Date().timeIntervalSince1970.rounded(.down))],
                                        keyID: keyID, key: key)
        let response = try await run("/usr/bin/curl", [
            "-sS", "--http2", "--max-time", "10", "--cacert", directory + "/tls/ca.pem", "-o", "/dev/null",
            "-w", "%{http_code}", "-H", "authorization: bearer \(jwt)", "-H", "apns-topic: \(bundleID)",
            "-H", "apns-push-type: alert", "--data-binary", #"{"aps":{"badge":1}}"#,
            "https://localhost:\(listening)/3/device/\(token)",
        ])
        #expect(response.stdout == "200")
        let records = try jsonLines(directory + "/pushes.jsonl")
        #expect(records.first?["token"]?.stringValue == token)

        process.terminate()
        let stopped = Task {
            for await _ in exited.stream {}
        }
        let waited = Task {
            try await Task.sleep(for: .seconds(5))
            stopped.cancel()
        }
        await stopped.value
        waited.cancel()
        #expect(!process.isRunning)
        #expect(process.terminationStatus == 0)
        let log = try String(contentsOfFile: directory + "/stderr", encoding: .utf8)
        let lines = log.split(separator: "\n")
        #expect(lines.allSatisfy { (try? JSONDecoder().decode(JSONValue.self, from: Data($0.utf8)))?.objectValue != nil })
        #expect(lines.contains { $0.contains(#""msg":"stopped""#) && $0.contains(#""sim.accepted":"1""#) })
        #expect(!log.contains(token))
    }
}
