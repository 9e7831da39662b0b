import Foundation
import HeraldAPNsSimulator
import HeraldRuntime

let usage = """
    herald-apns-sim — A strict local APNs stand-in (HTTP/2 over TLS) for tests, benchmarks and the local stack.

    Usage:
      herald-apns-sim [serve] [options]      serve until SIGTERM/SIGINT
      herald-apns-sim certs --out DIR [--dns NAME]... [--ip ADDR]...
                                             write ca.pem, server.pem (chain) and server-key.pem into DIR
                                             (default names: localhost, 127.0.0.1, ::1)

    Serve options (flag / environment; flags win, --key and --topic add to the environment's lists):
      --listen HOST:PORT          HERALD_SIM_ADDR                 default 127.0.0.1:2197 (port 0: any free port)
      --tls-dir DIR               HERALD_SIM_TLS_DIR              use DIR/server.pem + DIR/server-key.pem,
                                                                  generating a CA and server certificate there
                                                                  when they are missing (clients trust DIR/ca.pem)
      --cert FILE                 HERALD_SIM_CERT_FILE            server certificate chain (PEM), instead of --tls-dir
      --cert-key FILE             HERALD_SIM_CERT_KEY_FILE        its private key (PEM)
      --key TEAMID:KEYID:PATH     HERALD_SIM_KEYS (comma-separated) provider token key: .p8, public key or
                                                                  certificate (repeatable; at least one key needed)
      --config FILE               HERALD_SIM_CONFIG_FILE          JSON {"keys": [{"teamId","keyId","path"}],
                                                                  "topics": [...]} (paths relative to the file)
      --topic [TEAMID:]BUNDLE_ID  HERALD_SIM_TOPICS (comma-separated) allowed bundle ids (repeatable; none = any);
                                                                  with TEAMID only that team's tokens may push to it
                                                                  (else 400 TopicDisallowed, 403 TopicMismatch for
                                                                  its channels)
      --rules FILE                HERALD_SIM_RULES_FILE           programmed failures, re-read when it changes
      --record FILE               HERALD_SIM_RECORD_FILE          one JSON line per accepted push
      --record-rejected FILE      HERALD_SIM_REJECTED_FILE        one JSON line per rejected request
      --max-concurrent-streams N  HERALD_SIM_MAX_CONCURRENT_STREAMS  after the first valid token (default 1000)
      --delay-ms N | MIN-MAX      HERALD_SIM_DELAY_MS             answer every request after N ms (or a random
                                                                  time between MIN and MAX), as Apple's round trip
                                                                  does; a rule's delayMs replaces it (default 0)
      --environment ENV           HERALD_SIM_ENVIRONMENT          development (answers carry apns-unique-id, as
                                                                  Apple's sandbox's do) or production [development]
      --log-level LEVEL           HERALD_LOG_LEVEL                debug, info, warning, error (default info)

    Broadcast (iOS 18 channels; broadcasts are published on --listen at /4/broadcasts/apps/BUNDLE_ID):
      --manage-listen HOST:PORT   HERALD_SIM_MANAGE_ADDR          serve Apple's channel management API here
                                                                  (/1/apps/BUNDLE_ID/channels, /all-channels)
      --no-broadcast BUNDLE_ID    HERALD_SIM_NO_BROADCAST (comma-separated) bundles without the Broadcast
                                                                  capability: 400 FeatureNotEnabled (repeatable)
      --max-channels N            HERALD_SIM_MAX_CHANNELS         channels per bundle (default 10000, Apple's cap)
      --channel-subscribers N     HERALD_SIM_CHANNEL_SUBSCRIBERS  devices each channel's broadcasts reach (default 0)
      --record-broadcasts FILE    HERALD_SIM_BROADCAST_RECORD_FILE  one JSON line per accepted broadcast

    Rules file (--rules): {"rules": [{...}, ...]}. A request that passed every validation takes the first rule
    that matches it; a goawayAfterStreams rule applies to every connection. Keys of a rule:
      tokenPrefix          hex prefix of the device tokens it applies to (case-insensitive); absent: every token
      channelId            applies to broadcasts on this channel instead (with status, reason, times only)
      times                only the first N matching requests of each token (counted since the rules were loaded)
      status, reason       answer this status (400-599) and APNs reason; a 410's timestamp (ms since the epoch)
                           defaults to the time of the request
      delayMs              answer after this many ms (with status, or else the normal 200)
      reset                true: close the TCP connection without answering
      goawayAfterStreams   GOAWAY after this many requests on each connection (goawayReason: its debug data)
    Example: {"rules": [{"tokenPrefix": "dead", "status": 410, "reason": "Unregistered"},
                        {"tokenPrefix": "beef", "status": 503, "reason": "ServiceUnavailable", "times": 2},
                        {"delayMs": 40}]}
    """

let tool = "herald-apns-sim"
// A client that dies mid-stream must cost one connection (EPIPE on the next write), not the whole simulator.
signal(SIGPIPE, SIG_IGN)
var arguments = Array(CommandLine.arguments.dropFirst())
if CommandLineTool.helpRequested() { CommandLineTool.exitWithUsage(usage) }

/// Splits `--name value` / `--name=value` arguments; every option takes a value.
func parseOptions(_ arguments: [String], allowed: Set<String>) throws -> [(String, String)] {
    var options: [(String, String)] = []
    var index = 0
    while index < arguments.count {
        let argument = arguments[index]
        guard argument.hasPrefix("--") else { throw ConfigurationError(argument, "unexpected argument") }
        var name = String(argument.dropFirst(2))
        var value: String
        if let equals = name.firstIndex(of: "=") {
            value = String(name[name.index(after: equals)...])
            name = String(name[..<equals])
        } else {
            guard index + 1 < arguments.count else { throw ConfigurationError("--" + name, "needs a value") }
            index += 1
            value = arguments[index]
        }
        guard allowed.contains(name) else { throw ConfigurationError("--" + name, "unknown option") }
        options.append((name, value))
        index += 1
    }
    return options
}

if arguments.first == "certs" {
    do {
        let options = try parseOptions(Array(arguments.dropFirst()), allowed: ["out", "dns", "ip"])
        guard let directory = options.last(where: { $0.0 == "out" })?.1 else {
            throw ConfigurationError("--out", "certs needs --out DIR")
        }
        let dns = options.filter { $0.0 == "dns" }.map(\.1)
        let ips = options.filter { $0.0 == "ip" }.map(\.1)
        let files = try SimulatorCertificates.generate(directory: directory, dnsNames: dns.isEmpty ? ["localhost"] : dns,
                                                       ipAddresses: ips.isEmpty ? ["127.0.0.1", "::1"] : ips)
        print(files.caCertificate)
        print(files.serverCertificate)
        print(files.serverKey)
        exit(0)
    } catch {
        CommandLineTool.exitWithConfigurationError(tool, error)
    }
}
if arguments.first == "serve" { arguments.removeFirst() }

let environment = EnvironmentReader()
let simulator: APNsSimulator
let logger: Logger
do {
    let options = try parseOptions(arguments, allowed: [
        "listen", "tls-dir", "cert", "cert-key", "key", "config", "topic", "rules", "record", "record-rejected",
        "max-concurrent-streams", "delay-ms", "environment", "log-level", "manage-listen", "no-broadcast",
        "max-channels", "channel-subscribers", "record-broadcasts",
    ])
    func option(_ name: String) -> String? { options.last { $0.0 == name }?.1 }
    func list(_ variable: String) -> [String] {
        (environment.optionalString(variable) ?? "").split(separator: ",")
            .map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }

    logger = Logger(label: tool, minimumLevel: try environment.logLevel(override: option("log-level")))

    let listenText = option("listen") ?? environment.string("HERALD_SIM_ADDR", default: "127.0.0.1:2197")
    guard let listen = HostPort(listenText) else {
        throw ConfigurationError("HERALD_SIM_ADDR", "expected host:port, got \"\(listenText)\"")
    }

    let certificate: String, certificateKey: String
    if let directory = option("tls-dir") ?? environment.optionalString("HERALD_SIM_TLS_DIR") {
        let files = SimulatorCertificates.Files(directory: directory)
        if !files.exist {
            do { try SimulatorCertificates.generate(directory: directory) } catch {
                throw ConfigurationError("HERALD_SIM_TLS_DIR", "cannot write certificates into \(directory): \(error)")
            }
            logger.info("generated a CA and server certificate", ["sim.ca_file": files.caCertificate])
        }
        certificate = files.serverCertificate
        certificateKey = files.serverKey
    } else {
        guard let cert = option("cert") ?? environment.optionalString("HERALD_SIM_CERT_FILE"),
              let key = option("cert-key") ?? environment.optionalString("HERALD_SIM_CERT_KEY_FILE") else {
            throw ConfigurationError("HERALD_SIM_TLS_DIR", "give --tls-dir DIR, or --cert FILE and --cert-key FILE")
        }
        certificate = cert
        certificateKey = key
    }

    var keys: [ProviderKey] = []
    var topics: [String] = list("HERALD_SIM_TOPICS") + options.filter { $0.0 == "topic" }.map(\.1)
    if let configPath = option("config") ?? environment.optionalString("HERALD_SIM_CONFIG_FILE") {
        let file = try SimulatorConfigFile(path: configPath)
        keys += file.keys
        topics += file.topics
    }
    for specification in list("HERALD_SIM_KEYS") + options.filter({ $0.0 == "key" }).map(\.1) {
        keys.append(try ProviderKey(specification: specification))
    }

    let streamsText = option("max-concurrent-streams") ?? environment.string("HERALD_SIM_MAX_CONCURRENT_STREAMS",
                                                                             default: "1000")
    guard let maxStreams = Int(streamsText), (1...100_000).contains(maxStreams) else {
        throw ConfigurationError("HERALD_SIM_MAX_CONCURRENT_STREAMS", "expected 1...100000, got \"\(streamsText)\"")
    }

    let delayText = option("delay-ms") ?? environment.string("HERALD_SIM_DELAY_MS", default: "0")
    let delayBounds = delayText.split(separator: "-", omittingEmptySubsequences: false).map { Int($0) }
    guard (1...2).contains(delayBounds.count), let low = delayBounds.first ?? nil, let high = delayBounds.last ?? nil,
          0 <= low, low <= high, high <= 60_000 else {
        throw ConfigurationError("HERALD_SIM_DELAY_MS", "expected milliseconds N or MIN-MAX within 0...60000, got \"\(delayText)\"")
    }
    let environmentName = option("environment") ?? environment.string("HERALD_SIM_ENVIRONMENT", default: "development")
    guard ["development", "production"].contains(environmentName) else {
        throw ConfigurationError("HERALD_SIM_ENVIRONMENT", "expected development or production, got \"\(environmentName)\"")
    }
    var configuration = APNsSimulatorConfiguration(
        listen: listen, certificateChainPath: certificate, privateKeyPath: certificateKey, providerKeys: keys,
        rulesPath: option("rules") ?? environment.optionalString("HERALD_SIM_RULES_FILE"),
        recordPath: option("record") ?? environment.optionalString("HERALD_SIM_RECORD_FILE"),
        rejectedRecordPath: option("record-rejected") ?? environment.optionalString("HERALD_SIM_REJECTED_FILE"),
        maxConcurrentStreams: maxStreams,
        responseDelay: high == 0 ? nil : .milliseconds(low) ... .milliseconds(high))
    configuration.development = environmentName == "development"
    try configuration.allowTopics(topics)
    if let manageText = option("manage-listen") ?? environment.optionalString("HERALD_SIM_MANAGE_ADDR") {
        guard let manage = HostPort(manageText) else {
            throw ConfigurationError("HERALD_SIM_MANAGE_ADDR", "expected host:port, got \"\(manageText)\"")
        }
        configuration.manageListen = manage
    }
    configuration.broadcastDisabledBundles = Set(list("HERALD_SIM_NO_BROADCAST")
                                                 + options.filter { $0.0 == "no-broadcast" }.map(\.1))
    func count(_ name: String, _ variable: String, default fallback: Int) throws(ConfigurationError) -> Int {
        let text = option(name) ?? environment.string(variable, default: String(fallback))
        guard let value = Int(text), value >= 0 else {
            throw ConfigurationError(variable, "expected a whole number ≥ 0, got \"\(text)\"")
        }
        return value
    }
    configuration.maxChannelsPerBundle = try count("max-channels", "HERALD_SIM_MAX_CHANNELS", default: 10_000)
    configuration.channelSubscribers = try count("channel-subscribers", "HERALD_SIM_CHANNEL_SUBSCRIBERS", default: 0)
    configuration.broadcastRecordPath = option("record-broadcasts")
        ?? environment.optionalString("HERALD_SIM_BROADCAST_RECORD_FILE")
    simulator = try APNsSimulator(configuration: configuration, logger: logger)
    // Bind before the service group runs, so a taken port is a one-line configuration error.
    try simulator.start()
} catch {
    CommandLineTool.exitWithConfigurationError(tool, error)
}

do {
    try await ServiceGroup(services: [APNsSimulatorService(simulator: simulator)], gracePeriod: .seconds(5),
                           logger: logger).run()
    let statistics = simulator.statistics
    logger.info("stopped", ["sim.accepted": "\(statistics.accepted)", "sim.rejected": "\(statistics.rejected)"])
} catch let error as ConfigurationError {
    CommandLineTool.exitWithConfigurationError(tool, error)
} catch {
    logger.error("failed", ["error": "\(error)"])
    exit(1)
}
