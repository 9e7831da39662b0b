import HeraldAPNs
import HeraldCore
import HeraldKafka
import HeraldRuntime

/// Settings of herald-dispatcher. The executable fills it from `HERALD_*` variables (see README); tests shorten
/// the times.
public struct DispatcherConfiguration: Sendable {
    /// `HERALD_DISPATCHER_ADDR`: where `/healthz`, `/readyz` and `/metrics` listen.
    public var address: HostPort = HostPort(host: "127.0.0.1", port: 9090)
    /// `HERALD_TOPIC_JOBS`.
    public var jobsTopic = "herald.jobs"
    /// `HERALD_TOPIC_DLQ`.
    public var deadLetterTopic = "herald.dlq"
    /// `HERALD_CONSUMER_GROUP`. Fan-out progress records are kept per group too.
    public var consumerGroup = "herald-dispatcher"
    /// `HERALD_ACTIVITY_TTL_SECONDS`: the lifetime of Live Activity registrations (shared with ingest).
    public var activityTTL: Duration = .seconds(3600)
    /// `HERALD_JOB_STATUS_TTL_SECONDS`: a job's status is kept this long after its last update (shared with ingest).
    public var jobStatusTTL: Duration = .seconds(86_400)
    /// Kafka brokers and client settings for the consumer.
    public var kafka: KafkaConfiguration = KafkaConfiguration(brokers: ["127.0.0.1:9092"], clientID: "herald-dispatcher")
    /// `HERALD_CONSUMER_INSTANCE_ID`: static group membership (`group.instance.id`), so a dispatcher restarted
    /// in place takes its partitions back at once instead of after the dead member's session. Must be stable
    /// across restarts and unique in the group (a StatefulSet's pod name).
    public var consumerInstanceID: String?
    /// `HERALD_KAFKA_SESSION_TIMEOUT_SECONDS`: a member that sends no heartbeat for this long is dropped from the
    /// group (`session.timeout.ms`), and its partitions go to the others. 10 s (Kafka's lowest default
    /// `group.min.session.timeout.ms` is 6 s), with a heartbeat a tenth of it.
    public var sessionTimeout: Duration = .seconds(10)
    /// How long the broker may hold a fetch that has no new records (`fetch.wait.max.ms`). librdkafka's 500 ms
    /// default adds up to that much latency on brokers that do not answer a waiting fetch when records arrive
    /// (Tansu); 10 ms keeps end-to-end latency low at the cost of a few idle fetches per second.
    public var fetchMaxWait: Duration = .milliseconds(10)
    /// `HERALD_KAFKA_FETCH_STALL_SECONDS`: replaces a consumer whose fetches come back empty with records left on
    /// the broker (see `FetchStallRecovery`). Off by default: only the development broker needs it.
    public var fetchStallRecovery: FetchStallRecovery?
    /// Tests only: makes fetches come back empty, as a stalled broker's do.
    var injectedFetchStall: InjectedFetchStall?
    /// Tests only: leaves records out of fetches, as Tansu now and then does.
    var injectedOffsetGap: InjectedOffsetGap?
    /// A member that does not poll for this long leaves the group (`max.poll.interval.ms`).
    public var maxPollInterval: Duration = .seconds(300)
    /// `HERALD_RETRY_MAX_ATTEMPTS`: attempts per push, the first included, before a retryable failure is
    /// dead-lettered.
    public var maxAttempts = 5
    /// Backoff before the second attempt; doubles per attempt up to `retryMaximumDelay`, with full jitter
    /// (each wait is uniformly random between half and all of the computed delay).
    public var retryInitialDelay: Duration = .milliseconds(500)
    public var retryMaximumDelay: Duration = .seconds(30)
    /// Pushes sent and not yet answered, across all jobs. Also bounds the memory of every fan-out. Throughput is
    /// at most this over APNs' round trip: 2000 (two connections of 1000 streams) allows 50k pushes/s at 40 ms.
    public var maxInFlightPushes = 2000
    /// Jobs started and not yet settled, across all partitions (more are not fetched meanwhile).
    public var maxInFlightJobs = 512
    /// Jobs of one record key (one channel, post or device) started and not yet settled: past it that key's
    /// partition pauses, so a busy key cannot fill `maxInFlightJobs` and hold up every other partition.
    public var maxJobsPerKey = 8
    /// Subscriptions or registrations read from Redis per batch (HSCAN/ZSCAN `COUNT`).
    public var batchSize = 500
    /// `HERALD_MAX_JOB_BYTES`: a job record larger than this is dead-lettered (`invalid_job`) without being parsed.
    public var maxJobBytes = 256 * 1024
    /// How job records prove who wrote them. The executable requires `HERALD_JOB_SIGNING_SECRET_FILE` or an
    /// explicit `HERALD_JOB_SIGNATURES=unverified`.
    public var jobSigning: JobSigning = .unverified
    /// Batches of one fan-out being sent at once; with `batchSize` it bounds how far a fan-out runs ahead of its
    /// saved progress. Nil: twice as many as fill `maxInFlightPushes` (at least 3). A batch settles only when its
    /// slowest push is answered, and the next one starts only then; the batches beyond the limit wait for slots
    /// instead (behind jobs of one send), so answers are refilled a group at a time rather than a batch at a time.
    public var maxBatchesInFlightPerJob: Int?

    var batchesInFlightPerJob: Int {
        maxBatchesInFlightPerJob ?? max(3, 2 * maxInFlightPushes / max(1, batchSize))
    }
    /// Batches read by all fan-outs together and not yet settled (beyond each job's first): without it the
    /// process's memory would be `maxInFlightJobs` times one fan-out's. Nil: eight times as many as fill
    /// `maxInFlightPushes`, and at least what one fan-out runs with.
    public var maxBatchesHeld: Int?

    var batchesHeld: Int {
        maxBatchesHeld ?? max(batchesInFlightPerJob + JobRunner.readAhead + 1, 8 * maxInFlightPushes / max(1, batchSize))
    }
    /// How often expired subscriptions are swept out of Redis.
    public var subscriptionSweepInterval: Duration = .seconds(60)
    /// `HERALD_BROADCAST_JANITOR_INTERVAL_SECONDS`: how often the broadcast janitor looks at every app's channels.
    public var broadcastJanitorInterval: Duration = .seconds(300)
    /// `HERALD_BROADCAST_IDLE_SECONDS`: a post's broadcast channels are deleted after this long without a create
    /// or update (a post whose final update never came).
    public var broadcastIdle: Duration = .seconds(86_400)
    /// How long fan-out progress records live in Redis (a job resumed later starts again from the beginning).
    public var progressTTL: Duration = .seconds(86_400)
    /// How often completed offsets are committed.
    public var commitInterval: Duration = .milliseconds(100)
    /// On shutdown, how long in-flight jobs may run to completion before they are handed back (their offsets
    /// stay uncommitted and their progress is kept, so the next owner resumes them).
    public var drainTimeout: Duration = .seconds(15)
    /// `HERALD_ACCESS_LOG`: one line per request to the operations server (probes, metrics) at info level.
    public var accessLog = true
    /// Backoff between attempts when Redis or Kafka fails (resolving, removing tokens, writing dead letters).
    public var infrastructureRetryDelay: Duration = .milliseconds(500)

    public init() {}

    var consumer: KafkaConsumerConfiguration {
        let heartbeat = min(Duration.seconds(3), sessionTimeout / 10)
        var kafka = self.kafka
        kafka.properties["fetch.wait.max.ms"] = kafka.properties["fetch.wait.max.ms"]
            ?? String(max(1, fetchMaxWait.inMilliseconds))
        // librdkafka pre-fetches up to 64 MiB / 100,000 records by default; after a pause with a backlog that
        // would dwarf the dispatcher's own memory. 2 MiB (some thousands of jobs) keeps `maxInFlightJobs` fed.
        kafka.properties["queued.max.messages.kbytes"] = kafka.properties["queued.max.messages.kbytes"] ?? "2048"
        kafka.properties["queued.min.messages"] = kafka.properties["queued.min.messages"] ?? "10000"
        var consumer = KafkaConsumerConfiguration(kafka: kafka, groupID: consumerGroup, sessionTimeout: sessionTimeout,
                                                  heartbeatInterval: heartbeat, maxPollInterval: maxPollInterval,
                                                  offsetReset: .earliest)
        consumer.groupInstanceID = consumerInstanceID
        return consumer
    }
}

/// A stall injected by a test: the fetch loop answers every poll empty, without asking the consumer, while the
/// consumer's fetch wait is below `fetchWaitBelow` and it has received at least `afterRecords` records. That is
/// what Tansu does by itself, but only now and then; injected, the recovery is exercised on every run.
struct InjectedFetchStall: Sendable {
    var fetchWaitBelow: Duration
    var afterRecords: Int

    func applies(fetchWait: Duration, received: Int) -> Bool {
        fetchWait < fetchWaitBelow && received >= afterRecords
    }
}

/// A gap injected by a test: a record at an offset that is a multiple of `every` is left out of the fetch answer it
/// first arrives in (when a later record of its partition is in the same answer), so the consumer sees the
/// offsets jump, as Tansu makes them do now and then. With `firstAfterAssignment`, so is the first record (past
/// offset 0) a partition receives after each assignment. Read again, the record is kept.
struct InjectedOffsetGap: Sendable {
    var every: Int64?
    var firstAfterAssignment = false
}
