import Foundation
import HeraldAPNs
import HeraldCore
import HeraldRuntime
import HeraldStore

/// One push to one token: everything the APNs request and a dead letter need.
struct Push: Sendable {
    var token: String
    var tokenType: TokenType
    var environment: APNsEnvironment
    var topic: String
    var pushType: APNsPushType
    /// The exact bytes sent (shared by every push of a fan-out: arrays are copy-on-write).
    var payload: [UInt8]
}

/// A valid job of a known app, with its payloads encoded once: what each subscriber, registration or device
/// receives.
struct JobPlan: Sendable {
    let job: PushJob
    let app: App
    let credentials: APNsCredentials
    let priority: APNsPriority?
    let expiration: Date?
    /// When the job was created (for the end-to-end latency).
    let createdAt: Date?
    private let alertPayload: [UInt8]?
    /// `background` for an alert part that only wakes the app (content-available alone), else `alert`.
    private let alertPushType: APNsPushType
    /// A post's update (or end) as every registration and broadcast channel receives it.
    let liveActivityPayload: [UInt8]?
    private let startPayload: [UInt8]?
    private let liveActivityTopic: String

    /// Why a job that passed `PushJob.validate()` still cannot be sent.
    struct Refusal: Error {
        var error: ValidationError
    }

    /// `timestamp` is the `aps.timestamp` of Live Activity pushes (seconds), fixed once per job so every
    /// device sees the same update time.
    init(job: PushJob, app: App, timestamp: Int64) throws(Refusal) {
        self.job = job
        self.app = app
        guard let credentials = app.apnsCredentials else {
            throw Refusal(error: .invalid("appId", "app \(app.id)'s APNs key is not loaded"))
        }
        self.credentials = credentials
        // A device payload that only wakes the app goes at 5 by default even as an `alert` push: 10 is an error.
        let wakesOnly = job.target.kind == .device && job.resolvedPushType == .alert
            && job.payload.map(APNsPayload.isBackgroundOnly) == true
        priority = job.priority.flatMap(APNsPriority.init(rawValue:)) ?? (wakesOnly ? .powerConsiderate : nil)
        expiration = job.expiration.map { Date(timeIntervalSince1970: TimeInterval($0)) }
        createdAt = Timestamp.parse(job.createdAt)
        liveActivityTopic = app.apns.bundleId + (APNsPushType.liveactivity.topicSuffix ?? "")
        alertPayload = job.alert?.encoded()
        alertPushType = job.alert.map(APNsPayload.isBackgroundOnly) == true ? .background : .alert
        if var live = job.liveActivity {
            // `final` on a post job ends the Live Activity.
            if job.target.kind == .post, job.isFinal { live.event = .end }
            liveActivityPayload = APNsPayload.liveActivity(live, timestamp: timestamp).encoded()
        } else {
            liveActivityPayload = nil
        }
        startPayload = job.start.map { APNsPayload.start($0, timestamp: timestamp).encoded() }
        if let topic = job.target.topic, !app.owns(bundleID: topic) {
            throw Refusal(error: .invalid("target.topic", "target.topic must be \(app.apns.bundleId) or start with \(app.apns.bundleId)."))
        }
    }

    /// What a channel subscriber receives, or nil when the job has nothing for its token type (or, for a Live
    /// Activity update naming an activity, when the subscription is for another activity).
    func push(for subscription: ChannelTarget) -> Push? {
        switch subscription.tokenType {
        case .alert:
            guard let alertPayload else { return nil }
            return Push(token: subscription.deviceToken, tokenType: .alert, environment: subscription.environment,
                        topic: app.apns.bundleId, pushType: alertPushType, payload: alertPayload)
        case .liveActivityUpdate:
            guard let liveActivityPayload else { return nil }
            if let wanted = job.liveActivity?.activityID, subscription.activityID != wanted { return nil }
            return Push(token: subscription.deviceToken, tokenType: .liveActivityUpdate,
                        environment: subscription.environment, topic: liveActivityTopic, pushType: .liveactivity,
                        payload: liveActivityPayload)
        case .liveActivityStart:
            guard let startPayload else { return nil }
            return Push(token: subscription.deviceToken, tokenType: .liveActivityStart,
                        environment: subscription.environment, topic: liveActivityTopic, pushType: .liveactivity,
                        payload: startPayload)
        }
    }

    /// What a post's Live Activity registration receives: the update (or end), on the registration's own bundle
    /// id and environment.
    func push(for registration: ActivityPushTarget) -> Push? {
        guard let liveActivityPayload else { return nil }
        return Push(token: registration.pushToken, tokenType: .liveActivityUpdate, environment: registration.environment,
                    topic: registration.bundleID + (APNsPushType.liveactivity.topicSuffix ?? ""), pushType: .liveactivity,
                    payload: liveActivityPayload)
    }

    /// A device job's one push: its payload as given (Live Activity pushes get `aps.timestamp` when missing).
    func devicePush(timestamp: Int64) -> Push? {
        guard case .device(let device) = job.target, let payload = job.payload else { return nil }
        let pushType = job.resolvedPushType
        // Apple's topic for the push type: `<bundle>.voip`, `<bundle>.push-type.liveactivity`, …
        let topic = device.topic ?? app.apns.bundleId + (pushType.topicSuffix ?? "")
        return Push(token: device.token.lowercased(), tokenType: device.tokenType,
                    environment: device.environment ?? .production, topic: topic, pushType: pushType,
                    payload: APNsPayload.sent(payload, pushType: pushType, timestamp: timestamp).encoded())
    }

    func request(for push: Push) -> APNsRequest {
        APNsRequest(deviceToken: push.token, pushType: push.pushType, topic: push.topic, payload: push.payload,
                    priority: priority, expiration: expiration, collapseID: job.collapseId,
                    apnsID: job.apnsID(token: push.token))
    }
}

/// A device job's one APNs request, exactly as the dispatcher sends it (for `heraldctl send --direct`).
public enum DeviceJobRequest {
    public static func make(_ job: PushJob, app: App, now: Date = Date())
        throws(ValidationError) -> (request: APNsRequest, credentials: APNsCredentials, environment: APNsEnvironment) {
        let timestamp = Int64(now.timeIntervalSince1970)
        let plan: JobPlan
        do { plan = try JobPlan(job: job, app: app, timestamp: timestamp) } catch { throw error.error }
        guard let push = plan.devicePush(timestamp: timestamp) else {
            throw .invalid("target", "only a device job makes one APNs request")
        }
        return (plan.request(for: push), plan.credentials, push.environment)
    }
}

extension App {
    /// What signs the app's provider tokens; nil when its key is not loaded.
    var apnsCredentials: APNsCredentials? {
        apns.privateKey.map { APNsCredentials(teamID: apns.teamId, keyID: apns.keyId, privateKey: $0) }
    }
}
