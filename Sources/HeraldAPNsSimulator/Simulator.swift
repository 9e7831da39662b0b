import Foundation
import HeraldRuntime
import HeraldTLS
import Synchronization

/// A strict local stand-in for APNs: HTTP/2 over TLS, provider-token checks, Apple's request rules and
/// answers, programmable failures, and a record of what it accepted.
///
/// `start()` binds and serves on threads the simulator owns (one accept thread, one thread per connection);
/// `stop()` sends GOAWAY on every connection and closes them; `waitUntilStopped()` returns once every thread
/// has ended.
public final class APNsSimulator: Sendable {
    /// Counters since start.
    public struct Statistics: Sendable, Equatable {
        /// Connections accepted (TCP), including ones that failed the TLS handshake.
        public var connections: Int
        /// Pushes answered 200 (and recorded).
        public var accepted: Int
        /// Requests answered with an error status.
        public var rejected: Int
    }

    let configuration: APNsSimulatorConfiguration
    let logger: Logger
    let tls: TLSContext
    let verifier: ProviderTokenVerifier
    let ruleBook: RuleBook
    let recorder: LineRecorder?
    let rejectedRecorder: LineRecorder?
    let broadcastRecorder: LineRecorder?
    /// Broadcast channels created through the management listener.
    public let channels: ChannelBook
    /// The topic each device token was first pushed to (DeviceTokenNotForTopic).
    let tokenTopics = TokenTopicBook(limit: 1_000_000)
    let stopping = Atomic<Bool>(false)
    let liveThreads = Atomic<Int>(0)
    let openConnections = Atomic<Int>(0)
    let connectionCount = Atomic<Int>(0)
    let acceptedCount = Atomic<Int>(0)
    let rejectedCount = Atomic<Int>(0)
    private let started = Atomic<Bool>(false)
    private let boundPort = Atomic<UInt16>(0)
    private let boundManagePort = Atomic<UInt16>(0)

    private let metricAccepted: Counter
    private let metricRejected: CounterFamily

    /// Loads the TLS material, the keys and the rules file, and opens the record files. Nothing listens yet.
    public init(configuration: APNsSimulatorConfiguration, logger: Logger,
                metrics: MetricsRegistry = .shared) throws(ConfigurationError) {
        guard !configuration.providerKeys.isEmpty else {
            throw ConfigurationError("key", "at least one provider token key (TEAMID:KEYID:PATH) is required")
        }
        guard (1...Int(Int32.max)).contains(configuration.maxConcurrentStreams) else {
            throw ConfigurationError("max-concurrent-streams", "must be at least 1")
        }
        self.configuration = configuration
        self.logger = logger
        tls = try TLSContext.server(certificateChain: configuration.certificateChainPath,
                                    privateKey: configuration.privateKeyPath)
        verifier = ProviderTokenVerifier(keys: configuration.providerKeys,
                                         maximumAge: configuration.providerTokenMaximumAge,
                                         allowedSkew: configuration.providerTokenClockSkew,
                                         minimumInterval: configuration.providerTokenMinimumRefresh)
        ruleBook = RuleBook(path: configuration.rulesPath, rules: configuration.rules, logger: logger)
        try ruleBook.loadFile()
        recorder = try configuration.recordPath.map { path throws(ConfigurationError) in try LineRecorder(path: path) }
        rejectedRecorder = try configuration.rejectedRecordPath.map { path throws(ConfigurationError) in
            try LineRecorder(path: path)
        }
        broadcastRecorder = try configuration.broadcastRecordPath.map { path throws(ConfigurationError) in
            try LineRecorder(path: path)
        }
        channels = ChannelBook(maximumPerBundle: configuration.maxChannelsPerBundle,
                               defaultSubscribers: configuration.channelSubscribers)
        metricAccepted = metrics.counter("herald_sim_pushes_accepted_total",
                                         help: "Pushes the APNs simulator accepted (200).").labels()
        metricRejected = metrics.counter("herald_sim_requests_rejected_total",
                                         help: "Requests the APNs simulator answered with an error.",
                                         labels: ["status"])
    }

    /// The port the simulator listens on (after `start()`).
    public var port: UInt16 { boundPort.load(ordering: .acquiring) }

    /// The channel management listener's port (after `start()`, when `manageListen` is set).
    public var managePort: UInt16 { boundManagePort.load(ordering: .acquiring) }

    func broadcastEnabled(_ bundle: String) -> Bool {
        !configuration.broadcastDisabledBundles.contains(bundle) && configuration.allows(bundle)
    }

    /// Counters since start.
    public var statistics: Statistics {
        Statistics(connections: connectionCount.load(ordering: .relaxed), accepted: acceptedCount.load(ordering: .relaxed),
                   rejected: rejectedCount.load(ordering: .relaxed))
    }

    /// The rules in force.
    public var rules: [SimulatorRule] { ruleBook.rules }

    /// Replaces the rules now (attempt counts start again). A rules file, if configured, replaces them again
    /// when it next changes.
    public func setRules(_ rules: [SimulatorRule]) throws(ConfigurationError) {
        for rule in rules { try rule.validate() }
        ruleBook.replace(rules)
    }

    /// Binds the listening socket and starts the accept thread. Calling it again does nothing.
    public func start() throws(ConfigurationError) {
        guard !started.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let fd = try ListeningSocket.open(configuration.listen)
        boundPort.store(ListeningSocket.port(of: fd), ordering: .releasing)
        var manageFD: Int32?
        if let manageListen = configuration.manageListen {
            do { manageFD = try ListeningSocket.open(manageListen) } catch {
                close(fd)
                throw ConfigurationError("manage-listen", error.message)
            }
            boundManagePort.store(ListeningSocket.port(of: manageFD!), ordering: .releasing)
        }
        liveThreads.add(1, ordering: .acquiringAndReleasing)
        let thread = Thread.named("sim-accept") { [self, manageFD] in acceptLoop(fd, manageFD: manageFD) }
        thread.start()
        var fields = ["sim.addr": HostPort(host: configuration.listen.host, port: self.port).description,
                      "sim.keys": "\(configuration.providerKeys.count)", "sim.rules": "\(ruleBook.rules.count)"]
        if let manageListen = configuration.manageListen {
            fields["sim.manage_addr"] = HostPort(host: manageListen.host, port: managePort).description
        }
        logger.info("listening", fields)
    }

    /// Asks every thread to finish: connections get GOAWAY and are closed once their streams are answered.
    public func stop() { stopping.store(true, ordering: .releasing) }

    /// Returns once the accept thread and every connection thread have ended.
    public func waitUntilStopped() async {
        while liveThreads.load(ordering: .acquiring) > 0 {
            // Not Task.sleep: it returns at once in a cancelled task, and stopping happens on cancellation.
            await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(20)) { done.resume() }
            }
        }
    }

    var isStopping: Bool { stopping.load(ordering: .acquiring) }

    func countAccepted() {
        acceptedCount.add(1, ordering: .relaxed)
        metricAccepted.increment()
    }

    func countRejected(_ rejection: APNsRejection) {
        rejectedCount.add(1, ordering: .relaxed)
        metricRejected.labels(String(rejection.status)).increment()
    }

    private func acceptLoop(_ listenFD: Int32, manageFD: Int32?) {
        defer {
            close(listenFD)
            if let manageFD { close(manageFD) }
            logStatistics(force: true)
            liveThreads.subtract(1, ordering: .acquiringAndReleasing)
        }
        var lastStatistics = ContinuousClock.now
        var pollers = [pollfd(fd: listenFD, events: Int16(POLLIN), revents: 0)]
        if let manageFD { pollers.append(pollfd(fd: manageFD, events: Int16(POLLIN), revents: 0)) }
        while !isStopping {
            let ready = poll(&pollers, nfds_t(pollers.count), 100)
            if ContinuousClock.now - lastStatistics >= configuration.statisticsInterval {
                lastStatistics = .now
                logStatistics(force: false)
            }
            guard ready > 0 else { continue }
            for index in pollers.indices where pollers[index].revents & Int16(POLLIN) != 0 {
                acceptOne(pollers[index].fd, isManagement: index == 1)
            }
        }
    }

    private func acceptOne(_ listenFD: Int32, isManagement: Bool) {
        let client = accept(listenFD, nil, nil)
        guard client >= 0 else { return }
        _ = fcntl(client, F_SETFD, FD_CLOEXEC)
        _ = fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK)
        guard openConnections.load(ordering: .relaxed) < configuration.maxConnections else {
            logger.warning("connection refused: too many connections",
                           ["sim.max_connections": "\(configuration.maxConnections)"])
            close(client)
            return
        }
        var one: Int32 = 1
        setsockopt(client, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        let id = connectionCount.add(1, ordering: .relaxed).newValue
        openConnections.add(1, ordering: .relaxed)
        liveThreads.add(1, ordering: .acquiringAndReleasing)
        let connection = SimulatorConnection(descriptor: client, id: id, simulator: self, isManagement: isManagement)
        let thread = Thread.named("sim-conn-\(id)") {
            connection.run()
            self.openConnections.subtract(1, ordering: .relaxed)
            self.liveThreads.subtract(1, ordering: .acquiringAndReleasing)
        }
        thread.start()
    }

    private let lastLogged = Lock<Statistics?>(nil)

    private func logStatistics(force: Bool) {
        let current = statistics
        let changed = lastLogged.withLock { last -> Bool in
            defer { last = current }
            return last != current
        }
        guard force || changed else { return }
        logger.info("statistics", ["sim.connections": "\(current.connections)", "sim.accepted": "\(current.accepted)",
                                   "sim.rejected": "\(current.rejected)"])
    }
}

/// Opens a listening TCP socket.
enum ListeningSocket {
    /// The local port `fd` is bound to.
    static func port(of fd: Int32) -> UInt16 {
        var address = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        let port = address.ss_family == sa_family_t(AF_INET6)
            ? withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { $0.pointee.sin6_port } }
            : withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee.sin_port } }
        return UInt16(bigEndian: port)
    }

    static func open(_ address: HostPort) throws(ConfigurationError) -> Int32 {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV
        var list: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(address.host, String(address.port), &hints, &list) == 0, let first = list else {
            throw ConfigurationError("listen", "cannot resolve \(address)")
        }
        defer { freeaddrinfo(list) }
        let info = first.pointee
        let fd = socket(info.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw ConfigurationError("listen", "socket: \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        guard bind(fd, info.ai_addr, info.ai_addrlen) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw ConfigurationError("listen", "cannot bind \(address): \(reason)")
        }
        guard listen(fd, 128) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw ConfigurationError("listen", "cannot listen on \(address): \(reason)")
        }
        return fd
    }
}

/// Runs an `APNsSimulator` as a `Service`: starts it, and stops it when the task is cancelled (SIGTERM/SIGINT
/// through `ServiceGroup`).
public struct APNsSimulatorService: Service {
    public let simulator: APNsSimulator

    public init(simulator: APNsSimulator) { self.simulator = simulator }

    public func run() async throws {
        try simulator.start()
        await withTaskCancellationHandler {
            await simulator.waitUntilStopped()
        } onCancel: {
            simulator.stop()
        }
    }
}
