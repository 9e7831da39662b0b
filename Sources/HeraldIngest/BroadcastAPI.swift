import HeraldCore
import HeraldHTTP
import HeraldRuntime
import HeraldStore

/// A post's iOS 18 broadcast channels. The producer asks for one (`POST …/broadcast`, secret key); herald-ingest
/// publishes a job, the dispatcher (which alone holds the APNs key) creates the channel at APNs and stores it,
/// and this request waits for it. Devices read it (`GET …/broadcast?environment=`, public key) to start their
/// Live Activity on the channel.
struct BroadcastAPI: Sendable {
    let channels: BroadcastChannelStore
    let events: EventsAPI
    let gate: Gatekeeper
    /// How long a create request waits, publishing included, for the dispatcher before answering 503.
    let wait: Duration

    func register(on router: inout Router) {
        router.post("/v1/apps/{appID}/activities/{postIdHash}/broadcast", gate.endpoint(.producer) { request, admission in
            let post = try request.pathParameter("postIdHash")
            let job = try EventIntake.broadcastChannel(try request.jsonBody(), appID: admission.app.id, postIDHash: post)
            return try await create(job, post: post)
        })
        router.get("/v1/apps/{appID}/activities/{postIdHash}/broadcast", gate.endpoint(.everyDevice) { request, admission in
            let post = try request.pathParameter("postIdHash")
            try PostIDHash.validate(post, field: "postIdHash")
            guard let text = request.query["environment"] else { throw ValidationError.missing("environment") }
            guard let environment = APNsEnvironment(rawValue: text) else {
                throw ValidationError.invalid("environment", "environment must be production or sandbox")
            }
            guard case .ready(let channel) = try await channels.state(app: admission.app.id, postIDHash: post,
                                                                      environment: environment) else {
                throw HTTPError(status: 404, code: "not_found", message: "post \(post) has no \(text) broadcast channel")
            }
            return .json(bytes: channel.jsonValue.encoded())
        })
    }

    /// 200 with the post's channel when it has one, else publishes the job and answers 201 once the dispatcher
    /// stored the channel, 502 when APNs refused it, 503 when it did not come within `wait`.
    private func create(_ job: PushJob, post: String) async throws -> HTTPResponse {
        let wanted = job.broadcastChannel!
        let app = job.appId
        switch try await channels.state(app: app, postIDHash: post, environment: wanted.environment) {
        case .ready(let channel):
            let answer = try existing(channel, wanted: wanted)
            // Asked for again, the post is in use: the janitor leaves its channels to a later idle spell.
            try await channels.touch(app: app, postIDHash: post)
            return answer
        case .refused:
            // Asked again: the capability may have been enabled since.
            try await channels.clearRefusal(app: app, postIDHash: post, environment: wanted.environment)
        case .absent:
            break
        }
        let clock = ContinuousClock()
        let deadline = clock.now + wait
        _ = try await events.publish(job, clientChoseID: false)
        var pause = Duration.milliseconds(10)
        while clock.now < deadline {
            try await Task.sleep(for: pause)
            pause = min(pause * 2, .milliseconds(200))
            switch try await channels.state(app: app, postIDHash: post, environment: wanted.environment) {
            case .ready(let channel) where channel.storagePolicy == wanted.storagePolicy:
                return .json(bytes: channel.jsonValue.encoded(), status: 201)
            case .ready(let channel):
                return try existing(channel, wanted: wanted)
            case .refused(let reason, let message, let jobID) where jobID == nil || jobID == job.id:
                throw HTTPError(status: 502, code: "apns_refused", message: "APNs refused the channel: \(reason): \(message)")
            case .refused, .absent:
                // A refusal of an earlier request's job (run after that request gave up) is not this one's answer.
                continue
            }
        }
        throw HTTPError.unavailable("the channel was not made within \(wait); retry the same request later")
    }

    private func existing(_ channel: BroadcastChannel, wanted: PushJob.BroadcastChannel) throws -> HTTPResponse {
        guard channel.storagePolicy == wanted.storagePolicy else {
            throw HTTPError(status: 409, code: "conflict",
                            message: "the post's \(channel.environment.rawValue) channel has storage policy \(channel.storagePolicy.name); a channel's policy cannot change",
                            field: "storagePolicy")
        }
        return .json(bytes: channel.jsonValue.encoded())
    }
}
