import Foundation
import Synchronization

/// A process-wide registry of Prometheus metrics, rendered in the text exposition format for `/metrics`.
///
/// Metrics are created once (at start-up) and updated lock-free or under a short lock; label sets are small and
/// fixed by the code (route, status, reason), never user input, so memory stays bounded.
public final class MetricsRegistry: Sendable {
    public static let shared = MetricsRegistry()

    private let families = Lock<[String: any MetricFamily]>([:])

    public init() {}

    public func counter(_ name: String, help: String, labels: [String] = []) -> CounterFamily {
        family(name) { CounterFamily(name: name, help: help, labelNames: labels) }
    }

    public func gauge(_ name: String, help: String, labels: [String] = []) -> GaugeFamily {
        family(name) { GaugeFamily(name: name, help: help, labelNames: labels) }
    }

    public func histogram(_ name: String, help: String, labels: [String] = [],
                          buckets: [Double] = Histogram.latencyBuckets) -> HistogramFamily {
        family(name) { HistogramFamily(name: name, help: help, labelNames: labels, buckets: buckets) }
    }

    /// The whole registry in Prometheus text format 0.0.4.
    public func render() -> String {
        let snapshot = families.withLock { $0 }
        var out = ""
        for name in snapshot.keys.sorted() { snapshot[name]!.render(into: &out) }
        return out
    }

    private func family<F: MetricFamily>(_ name: String, make: () -> F) -> F {
        families.withLock { all in
            if let existing = all[name] {
                guard let typed = existing as? F else { preconditionFailure("metric \(name) registered twice with different types") }
                return typed
            }
            let created = make()
            all[name] = created
            return created
        }
    }
}

public protocol MetricFamily: Sendable {
    func render(into out: inout String)
}

/// Children of a labelled family, keyed by their label values.
final class Children<Child: Sendable>: Sendable {
    private let storage = Lock<[[String]: Child]>([:])

    func child(_ values: [String], make: () -> Child) -> Child {
        storage.withLock { all in
            if let found = all[values] { return found }
            let created = make()
            all[values] = created
            return created
        }
    }

    var sorted: [([String], Child)] {
        storage.withLock { all in all.sorted { $0.key.lexicographicallyPrecedes($1.key) }.map { ($0.key, $0.value) } }
    }
}

func labelText(_ names: [String], _ values: [String], extra: String? = nil) -> String {
    var parts = zip(names, values).map { name, value in "\(name)=\(JSONText.quoted(value))" }
    if let extra { parts.append(extra) }
    return parts.isEmpty ? "" : "{" + parts.joined(separator: ",") + "}"
}

func number(_ value: Double) -> String {
    if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
    return String(value)
}

public final class Counter: Sendable {
    private let value = Atomic<UInt64>(0)
    public func increment(by amount: UInt64 = 1) { value.add(amount, ordering: .relaxed) }
    public var current: UInt64 { value.load(ordering: .relaxed) }
}

public final class CounterFamily: MetricFamily {
    let name: String, help: String, labelNames: [String]
    private let children = Children<Counter>()

    init(name: String, help: String, labelNames: [String]) {
        (self.name, self.help, self.labelNames) = (name, help, labelNames)
    }

    /// The counter for these label values (in the order the labels were declared).
    public func labels(_ values: String...) -> Counter {
        precondition(values.count == labelNames.count, "\(name) takes labels \(labelNames)")
        return children.child(values) { Counter() }
    }

    public func increment(by amount: UInt64 = 1) { labels().increment(by: amount) }

    public func render(into out: inout String) {
        out += "# HELP \(name) \(help)\n# TYPE \(name) counter\n"
        for (values, counter) in children.sorted {
            out += "\(name)\(labelText(labelNames, values)) \(counter.current)\n"
        }
    }
}

public final class Gauge: Sendable {
    private let value = Atomic<Int64>(0)
    public func set(_ newValue: Int64) { value.store(newValue, ordering: .relaxed) }
    public func add(_ delta: Int64) { value.add(delta, ordering: .relaxed) }
    public var current: Int64 { value.load(ordering: .relaxed) }
}

public final class GaugeFamily: MetricFamily {
    let name: String, help: String, labelNames: [String]
    private let children = Children<Gauge>()

    init(name: String, help: String, labelNames: [String]) {
        (self.name, self.help, self.labelNames) = (name, help, labelNames)
    }

    public func labels(_ values: String...) -> Gauge {
        precondition(values.count == labelNames.count, "\(name) takes labels \(labelNames)")
        return children.child(values) { Gauge() }
    }

    public func set(_ value: Int64) { labels().set(value) }
    public func add(_ delta: Int64) { labels().add(delta) }

    public func render(into out: inout String) {
        out += "# HELP \(name) \(help)\n# TYPE \(name) gauge\n"
        for (values, gauge) in children.sorted {
            out += "\(name)\(labelText(labelNames, values)) \(gauge.current)\n"
        }
    }
}

public final class Histogram: Sendable {
    /// Seconds, from 0.5 ms to 10 s: request, push and publish latencies.
    public static let latencyBuckets: [Double] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                  1, 2.5, 5, 10]
    let buckets: [Double]
    private let state: Lock<(counts: [UInt64], sum: Double, count: UInt64)>

    init(buckets: [Double]) {
        self.buckets = buckets
        state = Lock((counts: [UInt64](repeating: 0, count: buckets.count), sum: 0, count: 0))
    }

    public func observe(_ value: Double) { observe(value, count: 1) }

    /// Observes `value` `count` times under one lock (a batch of requests answered together).
    public func observe(_ value: Double, count: UInt64) {
        guard count > 0 else { return }
        let index = buckets.firstIndex { value <= $0 }
        state.withLock { s in
            if let index { s.counts[index] += count }
            s.sum += value * Double(count)
            s.count += count
        }
    }

    /// Observes the seconds elapsed since `start`.
    public func observe(since start: ContinuousClock.Instant) { observe(Self.seconds(since: start)) }

    /// The seconds elapsed since `start`, as histograms take them.
    public static func seconds(since start: ContinuousClock.Instant) -> Double {
        let elapsed = ContinuousClock.now - start
        return elapsed.inSeconds
    }

    var snapshot: (counts: [UInt64], sum: Double, count: UInt64) { state.withLock { $0 } }
}

public final class HistogramFamily: MetricFamily {
    let name: String, help: String, labelNames: [String], buckets: [Double]
    private let children = Children<Histogram>()

    init(name: String, help: String, labelNames: [String], buckets: [Double]) {
        (self.name, self.help, self.labelNames, self.buckets) = (name, help, labelNames, buckets)
    }

    public func labels(_ values: String...) -> Histogram {
        precondition(values.count == labelNames.count, "\(name) takes labels \(labelNames)")
        return children.child(values) { Histogram(buckets: buckets) }
    }

    public func observe(_ value: Double) { labels().observe(value) }
    public func observe(since start: ContinuousClock.Instant) { labels().observe(since: start) }

    public func render(into out: inout String) {
        out += "# HELP \(name) \(help)\n# TYPE \(name) histogram\n"
        for (values, histogram) in children.sorted {
            let s = histogram.snapshot
            var cumulative: UInt64 = 0
            for (bound, count) in zip(buckets, s.counts) {
                cumulative += count
                out += "\(name)_bucket\(labelText(labelNames, values, extra: "le=\"\(number(bound))\"")) \(cumulative)\n"
            }
            out += "\(name)_bucket\(labelText(labelNames, values, extra: "le=\"+Inf\"")) \(s.count)\n"
            out += "\(name)_sum\(labelText(labelNames, values)) \(s.sum)\n"
            out += "\(name)_count\(labelText(labelNames, values)) \(s.count)\n"
        }
    }
}
