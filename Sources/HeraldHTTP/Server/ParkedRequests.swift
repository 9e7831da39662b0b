import HeraldRuntime

/// The requests whose handler is running ("parked"), across every loop: so the deadline sweep and shutdown can
/// answer them 503 and cancel their handlers.
///
/// A parked request is answered exactly once: its handler, the sweep or shutdown claims it (`RequestContext.claim`)
/// and hands the response to the connection's loop, which alone touches the connection.
final class ParkedRequests: Sendable {
    let engine: RequestEngine
    /// Parked requests, spread over shards so the loops and handler tasks rarely meet on one lock.
    private let shards: [ShardLock]

    init(engine: RequestEngine) {
        self.engine = engine
        shards = (0..<16).map { _ in ShardLock() }
    }

    /// Requests whose handler is running, by context; `closed` once shutdown has answered them all.
    struct Shard {
        var entries: [ObjectIdentifier: (context: RequestContext, deadline: ContinuousClock.Instant)] = [:]
        var closed = false
    }

    final class ShardLock: Sendable {
        let state = Lock(Shard())
    }

    private func shard(_ context: RequestContext) -> ShardLock {
        shards[Int(UInt(bitPattern: ObjectIdentifier(context).hashValue) % UInt(shards.count))]
    }

    /// Runs the handler in a task preferring the loop's thread. False (nothing started) once shutdown has begun
    /// answering parked requests: the caller answers 503 itself. Checking `closed` and registering happen under
    /// the shard lock shutdown takes, so every parked request is one shutdown can see.
    func park(_ context: RequestContext, request: HTTPRequest, handler: @escaping HTTPHandler) -> Bool {
        let deadline = ContinuousClock.now + engine.requestDeadline
        let lock = shard(context).state
        let accepted = lock.withLock { shard -> Bool in
            guard !shard.closed else { return false }
            shard.entries[ObjectIdentifier(context)] = (context, deadline)
            return true
        }
        guard accepted else { return false }
        let task = Task(executorPreference: context.loop) { [engine] in
            let response = await engine.respond(to: request, with: handler)
            self.complete(context, with: response)
        }
        lock.withLock { _ in context.handlerTask = task }
        return true
    }

    /// Hands a handler's response to its connection, unless the deadline sweep or shutdown answered first.
    private func complete(_ context: RequestContext, with response: HTTPResponse) {
        guard context.claim() else { return }
        _ = shard(context).state.withLock { $0.entries.removeValue(forKey: ObjectIdentifier(context)) }
        context.loop.deliver(response, for: context)
    }

    /// Answers 503 to parked requests past their deadline and cancels their handlers.
    func expireOverdue(now: ContinuousClock.Instant = .now) {
        var expired: [RequestContext] = []
        var handlers: [Task<Void, Never>] = []
        for shard in shards {
            shard.state.withLock { shard in
                for (key, entry) in shard.entries where entry.deadline <= now {
                    shard.entries[key] = nil
                    if answer(entry.context, with: HTTPError.unavailable("the request took too long")) {
                        expired.append(entry.context)
                        if let task = entry.context.handlerTask { handlers.append(task) }
                    }
                }
            }
        }
        for task in handlers { task.cancel() }
        if !expired.isEmpty {
            engine.logger.warning("handlers past the request deadline answered 503", ["http.count": "\(expired.count)"])
        }
    }

    /// Shutdown: answers 503 to every parked request, cancels their handlers, and refuses to park new ones.
    /// Returns how many were answered.
    func failParked() -> Int {
        var answered = 0
        var handlers: [Task<Void, Never>] = []
        for shard in shards {
            shard.state.withLock { shard in
                shard.closed = true
                for entry in shard.entries.values
                where answer(entry.context, with: HTTPError.unavailable("the server is shutting down")) {
                    answered += 1
                    if let task = entry.context.handlerTask { handlers.append(task) }
                }
                shard.entries = [:]
            }
        }
        for task in handlers { task.cancel() }
        return answered
    }

    /// Claims a parked request for an error answer and hands it to the loop. False if its handler won.
    private func answer(_ context: RequestContext, with error: HTTPError) -> Bool {
        guard context.claim() else { return false }
        context.loop.deliver(error.response, for: context)
        return true
    }
}
