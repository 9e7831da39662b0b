import Foundation
import HeraldTestSupport

/// A channel events are sent to: its subscribers are fixed before the load starts, so every accepted event's
/// targets are known exactly.
struct EventChannel: Sendable {
    var name: String
    var tokens: [UInt32]
}

/// One keep-alive connection to the ingest, reopened after a transport failure.
struct IngestConnection {
    let port: UInt16
    private var client: RawHTTPClient?

    init(port: UInt16) { self.port = port }

    /// The answer, or the transport failure's description.
    mutating func call(_ method: String, _ path: String, key: String, body: String?) -> Result<RawHTTPClient.Response, SoakFailure> {
        do {
            if client == nil { client = try RawHTTPClient(port: port, timeout: 10) }
            var headers = ["X-API-Key": key]
            if body != nil { headers["Content-Type"] = "application/json" }
            let response = try client!.request(method, path, headers: headers, body: body)
            if response.headers["connection"]?.lowercased() == "close" { client = nil }
            return .success(response)
        } catch {
            client = nil
            return .failure(SoakFailure("\(error)"))
        }
    }
}

/// Subscribes each channel's fixed subscribers: all but two accepted tokens, one the simulator rejects for good,
/// one it answers 503 twice.
func subscribeChannels(_ options: Options, tokens: TokenBook) throws -> [EventChannel] {
    var connection = IngestConnection(port: options.ingestPort)
    var channels: [EventChannel] = []
    for number in 0..<options.channels {
        let name = "soak:order:\(number):status"
        var members: [UInt32] = []
        let kinds = [TokenClass.rejected, .transient] + Array(repeating: .normal, count: options.subscribersPerChannel - 2)
        for kind in kinds {
            let (token, index) = tokens.make(kind)
            let body = #"{"channel":"\#(name)","deviceToken":"\#(token)","tokenType":"alert"}"#
            switch connection.call("POST", "/v1/apps/\(options.app)/subscriptions", key: options.publicKey, body: body) {
            case .success(let response) where response.status == 201: members.append(index)
            case .success(let response): throw SoakFailure("subscribing \(name) answered \(response.status): \(response.text)")
            case .failure(let failure): throw SoakFailure("subscribing \(name): \(failure)")
            }
        }
        channels.append(EventChannel(name: name, tokens: members))
    }
    return channels
}

struct SoakFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// One load worker: its share of the rate on its own connection, until `end`. Runs on a thread of its own.
final class Worker {
    private let number: Int
    private let options: Options
    private let ledger: Ledger
    private let tokens: TokenBook
    private let channels: [EventChannel]
    private var connection: IngestConnection
    private var stats = Array(repeating: KindStats(), count: Kind.allCases.count)
    /// Tokens this worker subscribed to its churn channels and has not unsubscribed yet.
    private var churn: [String] = []
    private var post = ActivityPost()

    /// A Live Activity post: its tokens are registered first, then it gets updates and finally an `end`.
    private struct ActivityPost {
        static let tokensPerPost = 3
        static let eventsPerPost = 4
        var hash = hex(UInt64.random(in: 0...UInt64.max), digits: 16)
        var tokens: [UInt32] = []
        var registrationsLeft = tokensPerPost
        var eventsLeft = eventsPerPost
    }

    init(number: Int, options: Options, ledger: Ledger, tokens: TokenBook, channels: [EventChannel]) {
        self.number = number
        self.options = options
        self.ledger = ledger
        self.tokens = tokens
        self.channels = channels
        connection = IngestConnection(port: options.ingestPort)
    }

    /// Sends requests on a fixed schedule (the worker's share of `rate`) until `end`; a worker that falls behind by
    /// more than a second skips ahead instead of bursting.
    func run(start: ContinuousClock.Instant, end: ContinuousClock.Instant) -> [KindStats] {
        let interval = Duration.seconds(Double(options.workers) / options.rate)
        var next = start + interval * (Double(number) / Double(options.workers))
        while true {
            let now = ContinuousClock.now
            guard now < end else { break }
            if next > now {
                let wait = next - now
                Thread.sleep(forTimeInterval: wait.inSeconds)
            } else if now - next > .seconds(1) {
                next = now
            }
            next += interval
            step()
        }
        return stats
    }

    /// One request, its kind drawn by weight: subscription churn 32%, Live Activity 35%, channel events 25%,
    /// device pushes 8%.
    private func step() {
        let draw = Int.random(in: 0..<100)
        switch draw {
        case 0..<11: churn.count >= 100 ? unsubscribe() : subscribe()
        case 11..<21: churn.isEmpty ? subscribe() : list()
        case 21..<32: churn.isEmpty ? subscribe() : unsubscribe()
        case 32..<67: activity()
        case 67..<92: channelEvent()
        default: devicePush()
        }
    }

    private func subscribe() {
        let (token, _) = tokens.make(.normal)
        let channel = "soak:churn:\(number):\(Int.random(in: 0..<50))"
        let body = #"{"channel":"\#(channel)","deviceToken":"\#(token)","tokenType":"alert","metadata":{"soak":true}}"#
        if send(.subscribe, "POST", "/v1/apps/\(options.app)/subscriptions", key: options.publicKey, body: body) != nil {
            churn.append(token)
        }
    }

    private func list() {
        let token = churn.randomElement()!
        _ = send(.listSubscriptions, "GET", "/v1/apps/\(options.app)/subscriptions?deviceToken=\(token)",
                 key: options.publicKey, body: nil)
    }

    private func unsubscribe() {
        let token = churn.removeFirst()
        _ = send(.unsubscribe, "DELETE", "/v1/apps/\(options.app)/subscriptions", key: options.publicKey,
                 body: #"{"deviceToken":"\#(token)"}"#)
    }

    private func activity() {
        if post.registrationsLeft > 0 {
            post.registrationsLeft -= 1
            let kind: TokenClass = switch Int.random(in: 0..<10) {
            case 0: .rejected
            case 1: .transient
            default: .normal
            }
            let (token, index) = tokens.make(kind)
            let body = #"{"push_token":"\#(token)","post_id_hash":"\#(post.hash)","bundle_id":"\#(options.bundleID)"}"#
            if send(.registerActivity, "POST", "/v1/apps/\(options.app)/activities/register", key: options.publicKey,
                    body: body) != nil {
                post.tokens.append(index)
            }
            return
        }
        post.eventsLeft -= 1
        let id = ledger.eventID()
        let event = post.eventsLeft == 0 ? "end" : "update"
        let body = #"{"event":"\#(event)","contentState":{"soak":"\#(id)","step":\#(ActivityPost.eventsPerPost - post.eventsLeft)}}"#
        if send(.activityEvent, "POST", "/v1/apps/\(options.app)/activities/\(post.hash)/events", key: options.secretKey,
                body: body) != nil {
            ledger.accepted(AcceptedEvent(id: id, tokens: post.tokens))
        }
        if post.eventsLeft == 0 { post = ActivityPost() }
    }

    private func channelEvent() {
        let channel = channels.randomElement()!
        let id = ledger.eventID()
        let body = #"{"channel":"\#(channel.name)","alert":{"aps":{"alert":{"title":"Order update","body":"Shipped"}},"soak":"\#(id)"}}"#
        if send(.channelEvent, "POST", "/v1/apps/\(options.app)/events", key: options.secretKey, body: body) != nil {
            ledger.accepted(AcceptedEvent(id: id, tokens: channel.tokens))
        }
    }

    private func devicePush() {
        let kind: TokenClass = switch Int.random(in: 0..<20) {
        case 0..<8: .normal
        case 8..<12: .transient
        case 12..<17: .unregistered
        default: .exhausted
        }
        let (token, index) = tokens.make(kind)
        let id = ledger.eventID()
        let body = #"{"payload":{"aps":{"alert":{"title":"Soak","body":"Direct"}},"soak":"\#(id)"}}"#
        if send(.devicePush, "POST", "/v1/apps/\(options.app)/devices/\(token)/push", key: options.secretKey,
                body: body) != nil {
            ledger.accepted(AcceptedEvent(id: id, tokens: [index]))
        }
    }

    /// Sends one request and records its latency; the response when its status is the expected one.
    private func send(_ kind: Kind, _ method: String, _ path: String, key: String, body: String?) -> RawHTTPClient.Response? {
        let started = ContinuousClock.now
        let result = connection.call(method, path, key: key, body: body)
        let elapsed = ContinuousClock.now - started
        stats[kind.rawValue].latenciesMs.append(elapsed.inSeconds * 1000)
        switch result {
        case .success(let response) where response.status == kind.expectedStatus:
            return response
        case .success(let response):
            stats[kind.rawValue].unexpected["\(response.status)", default: 0] += 1
        case .failure(let failure):
            stats[kind.rawValue].unexpected[failure.description, default: 0] += 1
        }
        return nil
    }
}
