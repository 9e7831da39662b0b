import Foundation
import HeraldRuntime
import Synchronization

/// The request kinds of the mixed load.
enum Kind: Int, CaseIterable, Sendable {
    case subscribe, listSubscriptions, unsubscribe, registerActivity, channelEvent, activityEvent, devicePush

    var name: String {
        ["subscribe (POST)", "subscriptions (GET)", "unsubscribe (DELETE)", "activity register", "channel event",
         "activity event", "device push"][rawValue]
    }

    /// The status a healthy stack answers.
    var expectedStatus: Int {
        switch self {
        case .subscribe, .registerActivity: 201
        case .listSubscriptions, .unsubscribe: 200
        case .channelEvent, .activityEvent, .devicePush: 202
        }
    }

    var isEvent: Bool { expectedStatus == 202 }
}

/// Latencies and answers of one kind, kept by one worker (merged at the end).
struct KindStats: Sendable {
    var latenciesMs: [Double] = []
    var unexpected: [String: Int] = [:]

    mutating func merge(_ other: KindStats) {
        latenciesMs += other.latenciesMs
        unexpected.merge(other.unexpected, uniquingKeysWith: +)
    }
}

/// One accepted event and the tokens it must reach (shared arrays: a channel's subscribers, a post's tokens).
struct AcceptedEvent: Sendable {
    var id: UInt32
    var tokens: [UInt32]
}

/// What the load did: accepted events with their targets, and per-kind statistics.
final class Ledger: Sendable {
    private struct State {
        var events: [AcceptedEvent] = []
        var stats = Array(repeating: KindStats(), count: Kind.allCases.count)
    }

    private let state = Lock(State())
    private let nextEvent = Atomic<UInt32>(1)

    /// A fresh event id (carried in the payload as `"soak": "<id>"`).
    func eventID() -> UInt32 { nextEvent.wrappingAdd(1, ordering: .relaxed).oldValue }

    func accepted(_ event: AcceptedEvent) { state.withLock { $0.events.append(event) } }

    func merge(_ stats: [KindStats]) {
        state.withLock { s in
            for index in stats.indices { s.stats[index].merge(stats[index]) }
        }
    }

    var events: [AcceptedEvent] { state.withLock { $0.events } }
    var stats: [KindStats] { state.withLock { $0.stats } }
}
