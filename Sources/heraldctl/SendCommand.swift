import Foundation
import HeraldAPNs
import HeraldCore
import HeraldDispatcher
import HeraldKafka
import HeraldRedis
import HeraldRuntime
import HeraldStore

/// `heraldctl send`: one test push, the way an event goes (Kafka, the dispatcher) or straight to APNs.
enum SendCommand {
    static let usage = """
        heraldctl send --app ID (--device-token HEX | --channel NAME | --post POST_ID_HASH)
                       [--payload-file FILE | --alert-title TEXT [--alert-body TEXT]]
                       [--environment production|sandbox] [--push-type TYPE] [--token-type TYPE]
                       [--direct] [--dry-run] [--timeout SECONDS] [--json]

          Sends one test push and says what became of it.

          By default it goes the way an event does: a job signed with HERALD_JOB_SIGNING_SECRET_FILE is published
          to HERALD_TOPIC_JOBS, and heraldctl waits (up to --timeout, default 60 s) for a dispatcher to finish it,
          then prints the job's status from Redis: its counts, as GET /v1/apps/{app}/jobs/{jobId} gives them.

          --direct (with --device-token only) sends straight to APNs with the app's key from HERALD_APPS_FILE,
          exactly as the dispatcher would (HERALD_APNS_PRODUCTION_URL, HERALD_APNS_SANDBOX_URL, HERALD_APNS_CA_FILE),
          and prints Apple's answer: status, reason, apns-id and apns-unique-id (Apple's development environment
          only: the key to the Push Notifications Console's delivery log). --timeout bounds the connection and
          the answer each (default 10 s).

          --dry-run prints the exact request and sends nothing: the job record (topic, key, headers, value), or
          with --direct the HTTP/2 request (headers, the provider token shortened, payload).

          What is sent:
            --device-token  the payload (--payload-file, or an alert of --alert-title and --alert-body) as is, to
                            --environment (production), with --push-type (else from the payload) and --token-type
                            (alert)
            --channel       an event with that alert payload, to every subscriber of the channel
            --post          --payload-file holds the Live Activity event as POST …/activities/{postIdHash}/events
                            takes it: {"event": "update", "contentState": {...}}

          Exit codes:
            0  delivered: APNs answered 200, or every push of the job was delivered
            1  failed: Kafka, Redis or APNs unreachable, the job not finished or APNs not answering within
               --timeout, or APNs refused the push (its answer is printed)
            2  bad usage or configuration
            3  done, but some pushes were not delivered (their tokens removed, or dead-lettered) or some broadcasts
               were dead-lettered: see the counts

          Examples:
            heraldctl send --app shop --device-token a1b2… --environment sandbox --alert-title Hi --direct
            heraldctl send --app shop --channel order:42:status --payload-file alert.json --dry-run
        """

    static let flagNames: Set<String> = ["app", "device-token", "channel", "post", "payload-file", "alert-title",
                                         "alert-body", "environment", "push-type", "token-type", "timeout"]
    static let switches: Set<String> = ["direct", "dry-run", "json"]

    static func run(_ flags: Flags) async throws -> Int32 {
        let job = try job(from: flags)
        let output = Output()
        defer { output.flush() }
        if flags.has("direct") {
            guard case .device = job.target else { throw ConfigurationError("--direct", "needs --device-token") }
            let timeout = try flags.int("timeout", default: 10, range: 1...3600)
            return try await direct(job, dryRun: flags.has("dry-run"), json: flags.has("json"),
                                    timeout: .seconds(timeout), output: output)
        }
        let timeout = try flags.int("timeout", default: 60, range: 1...3600)
        return try await throughKafka(job, dryRun: flags.has("dry-run"), json: flags.has("json"),
                                      timeout: .seconds(timeout), output: output)
    }

    /// The job the flags describe, checked as the HTTP API checks an event.
    static func job(from flags: Flags) throws -> PushJob {
        guard let app = flags["app"] else { throw ConfigurationError("--app", "is required") }
        let targets = ["device-token", "channel", "post"].filter { flags[$0] != nil }
        guard targets.count == 1 else {
            throw ConfigurationError("--device-token", "give exactly one of --device-token, --channel and --post")
        }
        if flags["device-token"] == nil, let deviceOnly = ["environment", "push-type", "token-type"].first(where: { flags[$0] != nil }) {
            throw ConfigurationError("--" + deviceOnly, "applies to --device-token only")
        }
        let payload = try payload(flags)
        do throws(ValidationError) {
            if let token = flags["device-token"] {
                var body: [String: JSONValue] = ["payload": payload]
                body["environment"] = flags["environment"].map { .string($0) }
                body["pushType"] = flags["push-type"].map { .string($0) }
                body["tokenType"] = flags["token-type"].map { .string($0) }
                return try EventIntake.devicePush(.object(body), appID: app, deviceToken: token, jobID: nil)
            }
            if let channel = flags["channel"] {
                return try EventIntake.channelEvent(.object(["channel": .string(channel), "alert": payload]),
                                                    appID: app, jobID: nil)
            }
            guard flags["payload-file"] != nil else {
                throw ValidationError.invalid("payload", "--post takes --payload-file with the Live Activity event")
            }
            return try EventIntake.activityEvent(payload, appID: app, postIDHash: flags["post"] ?? "", jobID: nil)
        } catch {
            throw ConfigurationError(flag(for: error.field), error.message)
        }
    }

    /// The flag an event field comes from, for error messages.
    private static func flag(for field: String?) -> String {
        switch field {
        case "deviceToken": "--device-token"
        case "channel": "--channel"
        case "postIdHash": "--post"
        case "environment": "--environment"
        case "pushType": "--push-type"
        case "tokenType": "--token-type"
        default: "--payload-file"
        }
    }

    private static func payload(_ flags: Flags) throws -> JSONValue {
        if let path = flags["payload-file"] {
            guard flags["alert-title"] == nil, flags["alert-body"] == nil else {
                throw ConfigurationError("--payload-file", "give either --payload-file or --alert-title/--alert-body")
            }
            guard let data = FileManager.default.contents(atPath: path) else {
                throw ConfigurationError("--payload-file", "cannot read \(path)")
            }
            guard let value = JSONValue(parsing: Array(data)), value.objectValue != nil else {
                throw ConfigurationError("--payload-file", "\(path) is not a JSON object (\(JSONValue.inexactIntegerHint))")
            }
            return value
        }
        guard let title = flags["alert-title"] else {
            throw ConfigurationError("--alert-title", "give --payload-file or --alert-title (with --alert-body)")
        }
        var alert: [String: JSONValue] = ["title": .string(title)]
        alert["body"] = flags["alert-body"].map { .string($0) }
        return .object(["aps": .object(["alert": .object(alert)])])
    }

    // MARK: Through Kafka

    private static func throughKafka(_ job: PushJob, dryRun: Bool, json: Bool, timeout: Duration,
                                     output: Output) async throws -> Int32 {
        let connections = try Connections()
        let signing = try JobSigning(EnvironmentReader())
        let value = job.encoded()
        let headers = signing.headers(for: value)
        if dryRun {
            let record: JSONValue = .object([
                "topic": .string(connections.jobsTopic), "key": .string(job.recordKey),
                "headers": .object(Dictionary(headers.map { ($0.0, JSONValue.string(String(decoding: $0.1, as: UTF8.self))) },
                                              uniquingKeysWith: { a, _ in a })),
                "value": JSONValue(parsing: value) ?? .null,
            ])
            output.write(String(decoding: record.encoded(), as: UTF8.self) + "\n")
            if !json { FileHandle.standardError.write(Data("heraldctl: dry run: nothing published\n".utf8)) }
            return 0
        }
        let redis = try connections.redis()
        defer { Task { await redis.close() } }
        let statuses = JobStatusStore(redis: redis)
        let producer = try KafkaProducer(configuration: KafkaProducerConfiguration(
            kafka: connections.kafka, messageTimeout: .seconds(15), linger: .milliseconds(1)), logger: connections.logger)
        do {
            _ = try await producer.send(topic: connections.jobsTopic, key: job.recordKey, value: value, headers: headers)
        } catch {
            await producer.close()
            throw connections.explain(error, topic: connections.jobsTopic)
        }
        await producer.close()
        let published = ContinuousClock.now
        // As ingest does, so the status reads `queued` until a dispatcher starts the job.
        do { try await statuses.accepted(job) } catch { throw connections.explain(error) }
        if !json {
            FileHandle.standardError.write(Data("heraldctl: published job \(job.id) to \(connections.jobsTopic); waiting up to \(timeout) for a dispatcher\n".utf8))
        }
        var last: JobStatus?
        while ContinuousClock.now - published < timeout {
            do { last = try await statuses.read(app: job.appId, jobID: job.id) } catch { throw connections.explain(error) }
            if let status = last, status.state == .done {
                output.write(json ? String(decoding: status.jsonValue.encoded(), as: UTF8.self) + "\n"
                                  : describe(status, after: ContinuousClock.now - published))
                let counts = status.counts
                return counts.tokensRemoved + counts.deadLettered + counts.broadcastsDeadLettered > 0
                    || status.jobDeadLettered ? 3 : 0
            }
            try await Task.sleep(for: .milliseconds(200))
        }
        if json, let last { output.write(String(decoding: last.jsonValue.encoded(), as: UTF8.self) + "\n") }
        throw OperatorError("job \(job.id) is still \(last?.state.rawValue ?? "unknown") after \(timeout): "
                            + "is a dispatcher consuming \(connections.jobsTopic)? (GET /v1/apps/\(job.appId)/jobs/\(job.id) "
                            + "tells what becomes of it)")
    }

    private static func describe(_ status: JobStatus, after elapsed: Duration) -> String {
        let c = status.counts
        var text = "job \(status.jobID): done within \(String(format: "%.1f", elapsed.inSeconds)) s: \(c.delivered) delivered, "
            + "\(c.tokensRemoved) tokens removed, \(c.deadLettered) dead-lettered, \(c.retried) retries"
        if c.broadcasts + c.broadcastsDeadLettered > 0 {
            text += "; broadcasts: \(c.broadcasts) published, \(c.broadcastsDeadLettered) dead-lettered"
        }
        if status.jobDeadLettered { text += "; the whole job was dead-lettered (heraldctl dlq list says why)" }
        return text + "\n"
    }

    // MARK: Straight to APNs

    private static func direct(_ job: PushJob, dryRun: Bool, json: Bool, timeout: Duration,
                               output: Output) async throws -> Int32 {
        let env = EnvironmentReader()
        let appsFile = env.string("HERALD_APPS_FILE", default: "config/apps.json")
        let apps = try AppRegistry(loading: appsFile, for: .dispatcher)
        guard let app = apps.directory.apps[job.appId] else {
            throw ConfigurationError("--app", "app \(job.appId) is not in \(appsFile) (HERALD_APPS_FILE)")
        }
        let made: (request: APNsRequest, credentials: APNsCredentials, environment: APNsEnvironment)
        do { made = try DeviceJobRequest.make(job, app: app) } catch { throw ConfigurationError("--app", error.message) }
        var configuration = try APNsConfiguration(environment: env)
        configuration.connectionsPerEndpoint = 1
        configuration.connectTimeout = timeout
        configuration.requestTimeout = timeout
        let client: APNsClient
        do { client = try APNsClient(configuration: configuration, logger: Logger(label: "heraldctl", minimumLevel: .error)) }
        catch { throw ConfigurationError("HERALD_APNS_CA_FILE", "\(error)") }
        let url = made.environment == .production ? configuration.productionURL : configuration.sandboxURL
        if dryRun {
            let preview: (headers: [(String, String)], body: [UInt8])
            do { preview = try client.preview(made.request, credentials: made.credentials, environment: made.environment) }
            catch { throw ConfigurationError("--payload-file", error.message) }
            await client.shutdown(gracePeriod: .zero)
            if json {
                output.write(String(decoding: JSONValue.object([
                    "url": .string(url),
                    "headers": .array(preview.headers.map { .array([.string($0.0), .string($0.1)]) }),
                    "payload": JSONValue(parsing: preview.body) ?? .null,
                ]).encoded(), as: UTF8.self) + "\n")
            } else {
                var text = "POST \(url)\n"
                for (name, value) in preview.headers { text += "\(name): \(value)\n" }
                output.write(text + "\n" + String(decoding: preview.body, as: UTF8.self) + "\n")
                FileHandle.standardError.write(Data("heraldctl: dry run: nothing sent\n".utf8))
            }
            return 0
        }
        let response: APNsResponse
        do {
            response = try await client.send(made.request, credentials: made.credentials, environment: made.environment)
        } catch {
            await client.shutdown(gracePeriod: .zero)
            throw OperatorError("no answer from APNs at \(url): \(error)")
        }
        await client.shutdown(gracePeriod: .seconds(1))
        if json {
            var fields: [String: JSONValue] = ["status": .number(Double(response.status)), "url": .string(url)]
            fields["reason"] = response.reason.map { .string($0.description) }
            fields["apnsId"] = response.apnsID.map { .string($0) }
            fields["apnsUniqueId"] = response.uniqueID.map { .string($0) }
            fields["timestamp"] = response.timestamp.map { .string(Timestamp.rfc3339($0)) }
            output.write(String(decoding: JSONValue.object(fields).encoded(), as: UTF8.self) + "\n")
        } else {
            var text = "APNs (\(url)) answered \(response.status)"
            if let reason = response.reason { text += " \(reason.description)" }
            text += "\napns-id: \(response.apnsID ?? "none")\napns-unique-id: \(response.uniqueID ?? "none (production answers carry none)")\n"
            output.write(text)
        }
        return response.status == 200 ? 0 : 1
    }
}
