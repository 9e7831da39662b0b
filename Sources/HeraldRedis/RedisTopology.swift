import Foundation
import HeraldRuntime

/// Which Redis servers a client talks to, and which of them serves a slot.
///
/// The first call has the seeds asked, in order, for `CLUSTER SLOTS`: a standalone Redis answers that cluster
/// support is disabled (or the user may not ask), and every call then goes to the seed that answered; a cluster
/// answers its slot map, and each call goes to the master serving its key's slot. A `MOVED` reply, a node that stops
/// answering and a `CLUSTERDOWN` reply refresh the map in the background, at most one refresh at a time and one
/// per `refreshInterval`, so a failover is picked up within about the cluster's own failover time.
final class RedisTopology: Sendable {
    private let configuration: RedisConfiguration
    private let logger: Logger
    private let state = Lock(State())
    /// The least time between two refreshes of the slot map.
    static let refreshInterval: Duration = .milliseconds(250)

    private struct State {
        var mode = Mode.unknown
        /// One node per address, made on first use. A new slot map drops the nodes it no longer names (but the
        /// seeds): a node serves the calls that already hold it and stops its threads once the last one is done, so
        /// masters replaced under new addresses (pods rescheduled) do not pile up.
        var nodes: [RedisAddress: RedisNode] = [:]
        /// The seeds being asked whether they are a cluster.
        var detection: Task<Void, Never>?
        /// Why the seeds' last asking failed.
        var detectionError: RedisError?
        var refresh: Task<Void, Never>?
        /// A `MOVED` arrived while `refresh` ran: the map it installs may be older (a node whose gossip lags), so
        /// another refresh follows it.
        var movedDuringRefresh = false
        /// Nodes whose calls failed since the last refresh began: asked last, as one that is down would hold the
        /// refresh for its whole timeout.
        var failing: Set<RedisAddress> = []
        var lastRefresh: ContinuousClock.Instant?
        var isClosed = false

        func refreshCandidates(seeds: [RedisAddress]) -> [RedisAddress] {
            var seen = failing, order: [RedisAddress] = []
            if case .cluster(let slots) = mode {
                let serving = Set(slots.compactMap { $0.map(ObjectIdentifier.init) })
                for (address, node) in nodes where serving.contains(ObjectIdentifier(node)) {
                    if seen.insert(address).inserted { order.append(address) }
                }
            }
            for seed in seeds where seen.insert(seed).inserted { order.append(seed) }
            for address in nodes.keys where seen.insert(address).inserted { order.append(address) }
            return order + failing.filter { nodes[$0] != nil }.sorted { $0.description < $1.description }
        }
    }

    enum Mode {
        case unknown
        case standalone(RedisNode)
        /// The master serving each slot (nil: not served by any node the map named).
        case cluster([RedisNode?])

        var isUnknown: Bool { if case .unknown = self { true } else { false } }
    }

    /// Where a call goes.
    enum Route {
        case standalone(RedisNode)
        case cluster([RedisNode?])
    }

    init(configuration: RedisConfiguration, logger: Logger) {
        (self.configuration, self.logger) = (configuration, logger)
    }

    /// The standalone node or the slot map. Until the seeds have answered, calls to a single seed go to it as to a
    /// standalone Redis while it is asked in the background (a cluster node redirects what it does not serve), so
    /// a standalone Redis is used exactly as before and a client made while Redis is down fails fast. With several
    /// seeds, or `settled`, the call waits for the answer, so one seed being down costs nothing.
    func route(settled: Bool = false) async throws -> Route {
        while true {
            let (route, detection): (Route?, Task<Void, Never>?) = try state.withLock { state throws(RedisError) in
                if state.isClosed { throw RedisError(.closed, "the client is closed") }
                switch state.mode {
                case .standalone(let node): return (.standalone(node), nil)
                case .cluster(let slots): return (.cluster(slots), nil)
                case .unknown:
                    startDetection(&state)
                    if !settled, configuration.seeds.count == 1 {
                        return (.standalone(try nodeLocked(configuration.seeds[0], &state)), nil)
                    }
                    if let detection = state.detection { return (nil, detection) }
                    throw state.detectionError ?? RedisError(.connection, "no seed answered")
                }
            }
            if let route { return route }
            await detection?.value
            if let error = state.withLock({ state in state.mode.isUnknown ? state.detectionError : nil }) { throw error }
        }
    }

    /// Asks the seeds unless that is under way or was tried less than `refreshInterval` ago.
    private func startDetection(_ state: inout State) {
        guard state.detection == nil, state.lastRefresh.map({ .now - $0 >= Self.refreshInterval }) ?? true else { return }
        state.detection = Task {
            var failure: RedisError?
            do { try await self.detect() } catch let error as RedisError { failure = error } catch {
                failure = RedisError(.connection, "\(error)")
            }
            self.state.withLock { state in
                state.detection = nil
                state.detectionError = failure
                state.lastRefresh = .now
            }
        }
    }

    /// The node a call for `slot` goes to on `route`: nil slot (a command without a key) goes to any master.
    func node(for slot: Int?, on route: Route) throws(RedisError) -> RedisNode {
        switch route {
        case .standalone(let node): return node
        case .cluster(let slots):
            // A slot without a node asks for a new map: nothing else would, as no call reaches a node that could
            // answer MOVED once an operator assigns the slot again.
            if let slot {
                if let node = slots[slot] { return node }
                scheduleRefresh()
                throw RedisError(.unavailable, "CLUSTERDOWN no node serves slot \(slot)")
            }
            if let node = slots.lazy.compactMap({ $0 }).first { return node }
            scheduleRefresh()
            throw RedisError(.unavailable, "CLUSTERDOWN no node serves any slot")
        }
    }

    /// The masters serving slots on `route`, each once, in slot order.
    func masters(on route: Route) -> [RedisNode] {
        switch route {
        case .standalone(let node): return [node]
        case .cluster(let slots):
            var seen = Set<ObjectIdentifier>(), masters: [RedisNode] = []
            for case let node? in slots where seen.insert(ObjectIdentifier(node)).inserted { masters.append(node) }
            return masters
        }
    }

    /// The node at `address`, made on first use.
    func node(at address: RedisAddress) throws(RedisError) -> RedisNode {
        try state.withLock { state throws(RedisError) in try nodeLocked(address, &state) }
    }

    /// Once the client is closed no node is made: one made by a call still under way would never be closed.
    private func nodeLocked(_ address: RedisAddress, _ state: inout State) throws(RedisError) -> RedisNode {
        if state.isClosed { throw RedisError(.closed, "the client is closed") }
        if let node = state.nodes[address] { return node }
        let node = RedisNode(configuration: configuration.node(address), logger: logger)
        state.nodes[address] = node
        return node
    }

    /// A node answered `MOVED slot address`: the slot is served there from now on (a standalone seed that answers
    /// so is in a cluster after all), and the whole map is refreshed in the background.
    func moved(slot: Int, to address: RedisAddress) throws(RedisError) -> RedisNode {
        let node = try state.withLock { state throws(RedisError) in
            let node = try nodeLocked(address, &state)
            switch state.mode {
            case .cluster(var slots):
                slots[slot] = node
                state.mode = .cluster(slots)
            case .standalone, .unknown:
                let seed = try nodeLocked(configuration.seeds[0], &state)
                var slots = [RedisNode?](repeating: seed, count: RedisCluster.slotCount)
                slots[slot] = node
                state.mode = .cluster(slots)
            }
            if state.refresh != nil { state.movedDuringRefresh = true }
            return node
        }
        scheduleRefresh()
        return node
    }

    /// A call failed on its connection or the cluster said it is down: in a cluster the map may be stale (a
    /// failover), so it is refreshed, asking `node` (when known) last; a standalone Redis has no map.
    func callFailed(_ error: RedisError, on node: RedisAddress? = nil) {
        guard error.isConnectionFailure || error.message.hasPrefix("CLUSTERDOWN") else { return }
        let isCluster = state.withLock { state in
            guard case .cluster = state.mode else { return false }
            if let node, error.isConnectionFailure { state.failing.insert(node) }
            return true
        }
        if isCluster { scheduleRefresh() }
    }

    /// Whom the next refresh asks, in order: the masters of the current map, then the seeds, then any other node
    /// made, then those whose calls failed.
    var refreshCandidates: [RedisAddress] { state.withLock { $0.refreshCandidates(seeds: configuration.seeds) } }

    /// Every node this client has made.
    var nodes: [RedisNode] { state.withLock { Array($0.nodes.values) } }

    /// Refuses new calls and closes every node.
    func close() async {
        let nodes = state.withLock { state in
            state.isClosed = true
            state.refresh?.cancel()
            return Array(state.nodes.values)
        }
        for node in nodes { await node.close() }
    }

    /// The seeds in order, for the first call: the first that answers with a mode (an error: standalone; a slot map:
    /// a cluster) decides it.
    private func detect() async throws {
        var lastError = RedisError(.connection, "no seed to ask")
        for seed in configuration.seeds {
            let node = try node(at: seed)
            let reply: RedisValue
            do { reply = try await node.single(Self.slotsCommand) } catch let error as RedisError where error.isConnectionFailure {
                lastError = error
                continue
            }
            // A seed still loading its data set, or one not yet in the cluster (no slots), is passed over too.
            if let unavailable = RedisError.unavailability(of: reply) {
                lastError = unavailable
                continue
            }
            if case .error = reply {
                // Cluster support disabled, or an ACL without `cluster|slots`: one server (a cluster behind such
                // an ACL is found by its first MOVED, which may have come first).
                let isFirst = state.withLock { state in
                    guard case .unknown = state.mode, !state.isClosed else { return false }
                    state.mode = .standalone(node)
                    return true
                }
                guard isFirst else { return }
                logger.info("redis standalone", ["redis.addr": node.configuration.description])
                return
            }
            guard let ranges = RedisCluster.slotRanges(reply, asked: seed), !ranges.isEmpty else {
                lastError = RedisError(.unavailable, "CLUSTERDOWN \(seed) named no node serving a slot")
                continue
            }
            install(ranges)
            return
        }
        throw lastError
    }

    private static let slotsCommand: RESPEncoder = {
        var encoder = RESPEncoder()
        encoder.append(["CLUSTER", "SLOTS"])
        return encoder
    }()

    private func install(_ ranges: [(ClosedRange<Int>, RedisAddress)]) {
        let installed = state.withLock { state -> (changed: Bool, masters: [String])? in
            var slots = [RedisNode?](repeating: nil, count: RedisCluster.slotCount)
            for (range, address) in ranges {
                guard let node = try? nodeLocked(address, &state) else { return nil }
                for slot in range { slots[slot] = node }
            }
            let before: [RedisNode?]
            if case .cluster(let old) = state.mode { before = old } else { before = [] }
            state.mode = .cluster(slots)
            let named = Set(ranges.map(\.1)).union(configuration.seeds)
            state.nodes = state.nodes.filter { named.contains($0.key) }
            let changed = before.count != slots.count || zip(before, slots).contains { $0 !== $1 }
            return (changed, Set(ranges.map(\.1.description)).sorted())
        }
        if let (changed, masters) = installed, changed {
            logger.info("redis cluster map", ["redis.masters": masters.joined(separator: ","),
                                              "redis.ranges": "\(ranges.count)"])
        }
    }

    /// Refreshes the map in the background unless a refresh is running; spaced `refreshInterval` apart.
    private func scheduleRefresh() {
        state.withLock { state in
            guard state.refresh == nil, !state.isClosed else { return }
            let wait = state.lastRefresh.map { $0 + Self.refreshInterval - .now } ?? .zero
            state.refresh = Task {
                if wait > .zero { try? await Task.sleep(for: wait) }
                await self.refresh()
                let again = self.state.withLock { state in
                    state.refresh = nil
                    state.lastRefresh = .now
                    defer { state.movedDuringRefresh = false }
                    return state.movedDuringRefresh
                }
                if again { self.scheduleRefresh() }
            }
        }
    }

    /// Asks the `refreshCandidates` for `CLUSTER SLOTS`; the first full answer wins.
    private func refresh() async {
        let candidates = state.withLock { state in
            defer { state.failing = [] }
            return state.refreshCandidates(seeds: configuration.seeds)
        }
        for address in candidates {
            // Closing the client cancels a refresh under way: no map to install, nothing failed.
            if Task.isCancelled { return }
            guard let node = try? node(at: address), let reply = try? await node.single(Self.slotsCommand),
                  let ranges = RedisCluster.slotRanges(reply, asked: address), !ranges.isEmpty else { continue }
            install(ranges)
            return
        }
        if Task.isCancelled { return }
        logger.warning("redis cluster map refresh failed", ["redis.asked": "\(candidates.count)"])
    }
}
