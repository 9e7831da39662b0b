import HeraldRuntime

/// The dispatcher's metrics (Prometheus names under `herald_dispatcher_`). The APNs client adds its own under
/// `herald_apns_` to the same registry.
struct DispatcherMetrics: Sendable {
    let jobsConsumed: Counter
    let jobsInvalid: Counter
    let jobsCompleted: Counter
    let pushes: CounterFamily
    /// `pushes{push_type="alert"|"liveactivity", status="200"}`, looked up once: the per-push hot path.
    let deliveredAlert: Counter
    let deliveredLiveActivity: Counter
    let retries: CounterFamily
    let deadLetters: CounterFamily
    let deadLettersRefused: CounterFamily
    let tokensRemoved: CounterFamily
    let inFlightPushes: Gauge
    let inFlightJobs: Gauge
    let partitionsAssigned: Gauge
    let pushLatency: Histogram
    let endToEnd: Histogram
    let commits: CounterFamily
    let resumedFanOuts: Counter
    let resumedPushesSkipped: Counter
    let fanOutRescans: Counter
    let fetchStalls: Counter
    let offsetGaps: Counter
    let offsetsMissing: Gauge
    let rereads: Counter
    let offsetsExpired: Counter
    let pausesForBusyKeys: Counter

    /// End-to-end buckets reach further than one request's: a job may wait behind others or for retries.
    static let endToEndBuckets: [Double] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                                            30, 60, 300]

    init(_ registry: MetricsRegistry) {
        jobsConsumed = registry.counter("herald_dispatcher_jobs_consumed_total",
                                        help: "Records read from the jobs topic").labels()
        jobsInvalid = registry.counter("herald_dispatcher_jobs_invalid_total",
                                       help: "Jobs that failed validation (or named an unknown app) and were dead-lettered")
            .labels()
        jobsCompleted = registry.counter("herald_dispatcher_jobs_completed_total",
                                         help: "Jobs whose every push is settled (offset committable)").labels()
        pushes = registry.counter("herald_dispatcher_pushes_total",
                                  help: "Push attempts by push type, APNs status (or local error) and reason",
                                  labels: ["push_type", "status", "reason"])
        deliveredAlert = pushes.labels("alert", "200", "")
        deliveredLiveActivity = pushes.labels("liveactivity", "200", "")
        retries = registry.counter("herald_dispatcher_retries_total",
                                   help: "Push attempts scheduled again after a retryable failure", labels: ["reason"])
        deadLetters = registry.counter("herald_dispatcher_dead_letters_total",
                                       help: "Dead-letter records written, by APNs reason (or local error) and disposition",
                                       labels: ["reason", "disposition"])
        deadLettersRefused = registry.counter("herald_dispatcher_dead_letters_refused_total",
                                              help: "Dead letters the broker refused for good (too large, invalid); their pushes settled without one",
                                              labels: ["reason", "disposition"])
        tokensRemoved = registry.counter("herald_dispatcher_tokens_removed_total",
                                         help: "Subscriptions and registrations removed because APNs reported the token invalid",
                                         labels: ["kind"])
        inFlightPushes = registry.gauge("herald_dispatcher_in_flight_pushes",
                                        help: "Pushes being sent, waiting for an answer, or (in a fan-out) for their delivery to be recorded").labels()
        inFlightJobs = registry.gauge("herald_dispatcher_in_flight_jobs", help: "Jobs started and not yet settled")
            .labels()
        partitionsAssigned = registry.gauge("herald_dispatcher_partitions_assigned",
                                            help: "Jobs-topic partitions assigned to this member").labels()
        pushLatency = registry.histogram("herald_dispatcher_push_duration_seconds",
                                         help: "One push attempt: send to APNs answer").labels()
        endToEnd = registry.histogram("herald_dispatcher_end_to_end_seconds",
                                      help: "Job createdAt to APNs' answer, per delivered push",
                                      buckets: Self.endToEndBuckets).labels()
        commits = registry.counter("herald_dispatcher_offset_commits_total", help: "Offset commits by result",
                                   labels: ["result"])
        resumedFanOuts = registry.counter("herald_dispatcher_fanouts_resumed_total",
                                          help: "Fan-outs resumed from saved progress after a restart or rebalance")
            .labels()
        resumedPushesSkipped = registry.counter("herald_dispatcher_resumed_pushes_skipped_total",
                                                help: "Pushes a resumed fan-out did not send again: its earlier run had delivered them")
            .labels()
        fanOutRescans = registry.counter("herald_dispatcher_fanout_rescans_total",
                                         help: "Fan-outs that scanned their targets again from the start: the Redis process holding the channel or post changed mid-scan")
            .labels()
        fetchStalls = registry.counter("herald_dispatcher_fetch_stalls_total",
                                       help: "Consumers replaced because a partition's fetches stalled with records left")
            .labels()
        offsetGaps = registry.counter("herald_dispatcher_offset_gaps_total",
                                      help: "Offsets a fetch skipped over (a record left out); each is read again before a commit passes it")
            .labels()
        offsetsMissing = registry.gauge("herald_dispatcher_offsets_missing",
                                        help: "Offsets skipped over and not received yet; commits of their partitions wait")
            .labels()
        rereads = registry.counter("herald_dispatcher_offset_rereads_total",
                                   help: "Seeks back to a partition's oldest missing offset to read it again").labels()
        offsetsExpired = registry.counter("herald_dispatcher_offsets_expired_total",
                                          help: "Missing offsets the broker deleted (retention) before they were read again: their jobs may never have run")
            .labels()
        pausesForBusyKeys = registry.counter(
            "herald_dispatcher_busy_key_pauses_total",
            help: "Partitions paused because one record key had its most jobs under way").labels()
    }
}
