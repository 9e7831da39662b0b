import Foundation
import HeraldKafka
import HeraldRuntime

/// Reads a growing JSON-lines file from where the last read stopped, complete lines only.
final class LineTail {
    private let path: String
    private var offset: UInt64 = 0
    private var partial: [UInt8] = []

    init(path: String) { self.path = path }

    /// Calls `line` for each complete new line, reading 4 MiB at a time (a long run's record is hundreds of MiB).
    func read(_ line: (ArraySlice<UInt8>) -> Void) {
        guard let handle = FileHandle(forReadingAtPath: path) else { return }
        defer { try? handle.close() }
        try? handle.seek(toOffset: offset)
        while let data = try? handle.read(upToCount: 4 << 20), !data.isEmpty {
            offset += UInt64(data.count)
            partial.append(contentsOf: data)
            var start = partial.startIndex
            while let newline = partial[start...].firstIndex(of: UInt8(ascii: "\n")) {
                line(partial[start..<newline])
                start = newline + 1
            }
            partial.removeSubrange(..<start)
        }
    }
}

/// Field extraction by scanning bytes: the record files hold hundreds of thousands of lines per run, and only two
/// fields of each matter.
enum LineFields {
    /// The string value of the first `"key": "value"` in `line`.
    static func string(_ key: String, in line: ArraySlice<UInt8>) -> ArraySlice<UInt8>? {
        guard var index = valueStart(key, in: line), index < line.endIndex, line[index] == UInt8(ascii: "\"") else {
            return nil
        }
        index += 1
        guard let end = line[index...].firstIndex(of: UInt8(ascii: "\"")) else { return nil }
        return line[index..<end]
    }

    /// The integer value of the first `"key": 123` in `line`.
    static func integer(_ key: String, in line: ArraySlice<UInt8>) -> Int? {
        guard var index = valueStart(key, in: line) else { return nil }
        var value = 0
        var digits = 0
        while index < line.endIndex, (0x30...0x39).contains(line[index]) {
            value = value * 10 + Int(line[index] - 0x30)
            digits += 1
            index += 1
        }
        return digits > 0 ? value : nil
    }

    private static func valueStart(_ key: String, in line: ArraySlice<UInt8>) -> Int? {
        let pattern = Array("\"\(key)\"".utf8)
        guard line.count >= pattern.count else { return nil }
        var index = line.startIndex
        while index <= line.endIndex - pattern.count {
            if line[index] == pattern[0], line[index..<index + pattern.count].elementsEqual(pattern) {
                var cursor = index + pattern.count
                while cursor < line.endIndex, line[cursor] == UInt8(ascii: " ") { cursor += 1 }
                guard cursor < line.endIndex, line[cursor] == UInt8(ascii: ":") else { index += 1; continue }
                cursor += 1
                while cursor < line.endIndex, line[cursor] == UInt8(ascii: " ") { cursor += 1 }
                return cursor
            }
            index += 1
        }
        return nil
    }

    static func number(_ text: ArraySlice<UInt8>) -> UInt32? {
        guard !text.isEmpty, text.count <= 9 else { return nil }
        var value: UInt32 = 0
        for byte in text {
            guard (0x30...0x39).contains(byte) else { return nil }
            value = value * 10 + UInt32(byte - 0x30)
        }
        return value
    }
}

/// What became of the pushes: the simulator's records of accepted and rejected requests, and the dead-letter topic.
final class Settlement {
    /// (event id << 32 | token index) → how often the simulator accepted it.
    private(set) var delivered: [UInt64: UInt16] = [:]
    /// The same for dead letters.
    private(set) var deadLettered: [UInt64: UInt16] = [:]
    /// Token index → 410 answers (the dispatcher removes such a token; there is no dead letter).
    private(set) var unregistered: [UInt32: UInt16] = [:]
    /// Rejected answers by status (503 ones are what the dispatcher retried).
    private(set) var rejectedByStatus: [Int: Int] = [:]
    /// Lines or records that carried no soak event id or token (none expected).
    private(set) var foreign = 0

    private let deliveries: LineTail
    private let rejections: LineTail
    private let consumer: KafkaConsumer

    private init(options: Options, consumer: KafkaConsumer) {
        deliveries = LineTail(path: options.recordFile)
        rejections = LineTail(path: options.rejectedFile)
        self.consumer = consumer
    }

    /// Opens a group-less reader of every partition of the dead-letter topic from its beginning (the soak's broker
    /// holds only this run's records).
    static func open(_ options: Options) async throws -> Settlement {
        let kafka = KafkaConfiguration(brokerList: options.brokers, clientID: "herald-soak")
        let consumer = try KafkaConsumer(configuration: KafkaConsumerConfiguration(kafka: kafka, groupID: nil),
                                         logger: Logger(label: "herald-soak", minimumLevel: .warning))
        let partitions = try await consumer.partitionCount(topic: options.dlqTopic)
        try await consumer.assign((0..<partitions).map {
            KafkaTopicPartitionOffset(topic: options.dlqTopic, partition: Int32($0), offset: KafkaTopicPartitionOffset.beginning)
        })
        return Settlement(options: options, consumer: consumer)
    }

    /// Reads whatever is new in the three sources.
    func refresh() async throws {
        deliveries.read { line in
            guard let key = Self.key(line, token: "token") else { foreign += 1; return }
            delivered[key, default: 0] += 1
        }
        rejections.read { line in
            guard let status = LineFields.integer("status", in: line) else { foreign += 1; return }
            rejectedByStatus[status, default: 0] += 1
            if status == 410 {
                guard let token = LineFields.string("token", in: line), let index = TokenBook.index(of: token) else {
                    foreign += 1
                    return
                }
                unregistered[index, default: 0] += 1
            }
        }
        while true {
            let records = try await consumer.poll(maxRecords: 500, timeout: .milliseconds(100))
            if records.isEmpty { break }
            for record in records {
                guard let key = Self.key(record.value[...], token: "deviceToken") else { foreign += 1; continue }
                deadLettered[key, default: 0] += 1
            }
        }
    }

    func close() async { try? await consumer.close() }

    private static func key(_ line: ArraySlice<UInt8>, token field: String) -> UInt64? {
        guard let token = LineFields.string(field, in: line), let index = TokenBook.index(of: token),
              let soak = LineFields.string("soak", in: line), let event = LineFields.number(soak) else { return nil }
        return UInt64(event) << 32 | UInt64(index)
    }
}

/// The accounting of every accepted push against what the simulator and the dead-letter topic saw.
struct Tally {
    var events = 0
    var expected = 0
    var expectedByClass: [TokenClass: Int] = [:]
    var delivered = 0
    var deadLettered = 0
    var unregistered = 0
    var lost = 0
    var duplicates = 0
    /// Pushes that settled differently from their token's class (e.g. an accepted token dead-lettered).
    var otherOutcome = 0
    /// Deliveries and dead letters of no accepted event (events answered with an error yet published).
    var unaccounted = 0

    init(events: [AcceptedEvent], tokens: TokenBook, settlement: Settlement) {
        self.events = events.count
        var counted = 0
        for event in events {
            for token in event.tokens {
                let kind = tokens.kind(of: token)
                expected += 1
                expectedByClass[kind, default: 0] += 1
                let key = UInt64(event.id) << 32 | UInt64(token)
                let sent = Int(settlement.delivered[key] ?? 0)
                let dead = Int(settlement.deadLettered[key] ?? 0)
                let gone = kind == .unregistered ? Int(settlement.unregistered[token] ?? 0) : 0
                counted += sent + dead
                delivered += sent
                deadLettered += dead
                unregistered += gone
                let outcomes = sent + dead + gone
                if outcomes == 0 { lost += 1 } else { duplicates += outcomes - 1 }
                let wanted = switch kind {
                case .normal, .transient: sent
                case .rejected, .exhausted: dead
                case .unregistered: gone
                }
                if outcomes > 0, wanted == 0 { otherOutcome += 1 }
            }
        }
        let all = settlement.delivered.values.reduce(0) { $0 + Int($1) } + settlement.deadLettered.values.reduce(0) { $0 + Int($1) }
        unaccounted = all - counted
    }
}
