import Foundation
import HeraldRuntime
import Testing

@Suite struct LogWriterTests {
    /// Nobody reads the pipe, so the drain thread blocks on a full pipe at once: callers must still return, the
    /// lines that do not fit are dropped and counted, and once the pipe is read every line is either there or
    /// accounted for by a "log lines dropped" line.
    @Test func aStalledOutputNeverBlocksACallerAndWhatIsDroppedIsCounted() throws {
        var ends: [Int32] = [0, 0]
        try #require(pipe(&ends) == 0)
        let writer = LogWriter(descriptor: ends[1], capacity: 64 << 10)
        let logger = Logger(label: "stalled", writer: writer)
        let metricBefore = Self.droppedMetric()
        let lines = 20_000
        let padding = String(repeating: "x", count: 150)

        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            for index in 0..<lines { logger.info("line", ["n": String(index), "pad": padding]) }
            done.signal()
        }
        // A caller that blocked on the output would never get here: 20,000 lines are ~4 MB, the pipe holds 64 KiB.
        #expect(done.wait(timeout: .now() + 30) == .success, "a caller blocked on a stalled log output")
        let dropped = writer.droppedLines
        #expect(dropped > 0)
        #expect(dropped < UInt64(lines))
        #expect(Self.droppedMetric() - metricBefore >= dropped)

        // Now read: everything written is either delivered or counted in a "log lines dropped" line.
        var delivered = Set<Int>()
        var reported: UInt64 = 0
        var buffer = [UInt8]()
        var chunk = [UInt8](repeating: 0, count: 1 << 16)
        let deadline = ContinuousClock.now + .seconds(30)
        while delivered.count + Int(reported) < lines, ContinuousClock.now < deadline {
            var ready = pollfd(fd: ends[0], events: Int16(POLLIN), revents: 0)
            guard poll(&ready, 1, 1000) > 0 else { continue }
            let count = read(ends[0], &chunk, chunk.count)
            try #require(count > 0)
            buffer += chunk[0..<count]
            while let newline = buffer.firstIndex(of: 0x0A) {
                let line = Array(buffer[..<newline])
                buffer.removeSubrange(...newline)
                let object = try #require(JSONValue(parsing: line)?.objectValue, "not a JSON line")
                if object["msg"]?.stringValue == "log lines dropped" {
                    reported += UInt64(object["log.dropped"]?.stringValue ?? "") ?? 0
                } else {
                    let number = try #require(Int(object["n"]?.stringValue ?? ""))
                    #expect(delivered.insert(number).inserted, "line \(number) written twice")
                }
            }
        }
        #expect(reported == dropped)
        #expect(delivered.count + Int(reported) == lines)
        close(ends[0])
        close(ends[1])
    }

    @Test func flushWritesWhatIsQueuedAsOneJSONObjectPerLine() throws {
        var ends: [Int32] = [0, 0]
        try #require(pipe(&ends) == 0)
        defer { close(ends[0]); close(ends[1]) }
        let logger = Logger(label: "flush", metadata: ["component": "test"], writer: LogWriter(descriptor: ends[1]))
        logger.info("quoted \"text\"\nwith a newline", ["token": "sha256:abc"])
        logger.debug("below the level")
        logger.writer.flush(timeout: .seconds(5))
        #expect(logger.writer.droppedLines == 0)
        var chunk = [UInt8](repeating: 0, count: 4096)
        let count = read(ends[0], &chunk, chunk.count)
        try #require(count > 0)
        let text = Array(chunk[0..<count])
        #expect(text.filter { $0 == 0x0A }.count == 1)
        let object = try #require(JSONValue(parsing: text)?.objectValue)
        #expect(object["msg"]?.stringValue == "quoted \"text\"\nwith a newline")
        #expect(object["level"]?.stringValue == "info")
        #expect(object["logger"]?.stringValue == "flush")
        #expect(object["component"]?.stringValue == "test")
        #expect(object["token"]?.stringValue == "sha256:abc")
    }

    /// The access log's path (fields already in key order) writes what the dictionary path writes.
    @Test func sortedFieldsWriteTheSameLineAsADictionary() throws {
        var ends: [Int32] = [0, 0]
        try #require(pipe(&ends) == 0)
        defer { close(ends[0]); close(ends[1]) }
        let writer = LogWriter(descriptor: ends[1])
        let fields = [(key: "http.route", value: "/v1"), (key: "http.status", value: "201"), (key: "msg", value: "x")]
        Logger(label: "a", writer: writer).log(.info, "request", sortedFields: fields)
        Logger(label: "a", writer: writer).info("request", ["http.status": "201", "http.route": "/v1", "msg": "x"])
        Logger(label: "a", metadata: ["component": "c"], writer: writer).log(.info, "request", sortedFields: fields)
        writer.flush(timeout: .seconds(5))
        var chunk = [UInt8](repeating: 0, count: 4096)
        let count = read(ends[0], &chunk, chunk.count)
        let lines = String(decoding: chunk[0..<max(count, 0)], as: UTF8.self).split(separator: "\n")
            .map { $0.drop { $0 != "," } } // without the timestamp
        try #require(lines.count == 3)
        #expect(lines[0] == lines[1])
        #expect(lines[0] == #","level":"info","logger":"a","msg":"request","http.route":"/v1","http.status":"201"}"#)
        #expect(lines[2] == #","level":"info","logger":"a","msg":"request","component":"c","http.route":"/v1","http.status":"201"}"#)
    }

    private static func droppedMetric() -> UInt64 {
        let line = MetricsRegistry.shared.render().split(separator: "\n")
            .first { $0.hasPrefix("herald_log_lines_dropped_total ") }
        return line.flatMap { UInt64($0.split(separator: " ").last ?? "") } ?? 0
    }
}
