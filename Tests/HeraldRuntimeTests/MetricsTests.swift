import Foundation
import Testing
@testable import HeraldRuntime

@Suite struct MetricsTests {
    @Test func countersRenderInPrometheusTextFormat() {
        let registry = MetricsRegistry()
        let requests = registry.counter("herald_test_requests_total", help: "Requests.", labels: ["route", "status"])
        requests.labels("/v1/x", "200").increment()
        requests.labels("/v1/x", "200").increment(by: 2)
        requests.labels("/v1/x", "404").increment()
        let text = registry.render()
        #expect(text.contains("# TYPE herald_test_requests_total counter\n"))
        #expect(text.contains("herald_test_requests_total{route=\"/v1/x\",status=\"200\"} 3\n"))
        #expect(text.contains("herald_test_requests_total{route=\"/v1/x\",status=\"404\"} 1\n"))
    }

    @Test func histogramBucketsAreCumulative() {
        let registry = MetricsRegistry()
        let latency = registry.histogram("herald_test_seconds", help: "Latency.", buckets: [0.1, 1])
        latency.observe(0.05)
        latency.observe(0.5)
        latency.observe(5)
        let text = registry.render()
        #expect(text.contains("herald_test_seconds_bucket{le=\"0.1\"} 1\n"))
        #expect(text.contains("herald_test_seconds_bucket{le=\"1\"} 2\n"))
        #expect(text.contains("herald_test_seconds_bucket{le=\"+Inf\"} 3\n"))
        #expect(text.contains("herald_test_seconds_count 3\n"))
    }
}

@Suite struct LoggerTests {
    @Test func linesAreOneJSONObjectWithEscapedFields() throws {
        let line = String(decoding: Logger.line(level: .info, label: "test", message: "say \"hi\"\n",
                                                fields: ["a.b": "tab\there", "ctl": "\u{1}"]), as: UTF8.self)
        #expect(line.hasSuffix("}\n"))
        #expect(line.filter { $0 == "\n" }.count == 1)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: String])
        #expect(object["msg"] == "say \"hi\"\n")
        #expect(object["a.b"] == "tab\there")
        #expect(object["ctl"] == "\u{1}")
        #expect(object["level"] == "info")
        let stamp = try #require(object["ts"])
        #expect(stamp.count == 24 && stamp.hasSuffix("Z"))
        #expect(ISO8601DateFormatter.withMilliseconds.date(from: stamp).map { abs($0.timeIntervalSinceNow) < 60 } == true)
    }
}

private extension ISO8601DateFormatter {
    static var withMilliseconds: ISO8601DateFormatter {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter
    }
}

@Suite struct EnvironmentTests {
    @Test func readsTypedValuesAndRejectsBadOnes() throws {
        let env = EnvironmentReader(["N": "12", "BAD": "x", "ADDR": "0.0.0.0:8080", "S": "1.5", "ON": "on", "OFF": "Off"])
        #expect(try env.flag("ON", default: false) && !(try env.flag("OFF", default: true)))
        #expect(try env.flag("MISSING", default: true))
        let notAFlag = #expect(throws: ConfigurationError.self) { try env.flag("N", default: true) }
        #expect(notAFlag?.variable == "N")
        #expect(try env.int("N", default: 1) == 12)
        #expect(try env.int("MISSING", default: 7) == 7)
        #expect(throws: ConfigurationError.self) { try env.int("BAD", default: 1) }
        #expect(try env.address("ADDR", default: "1.2.3.4:1") == HostPort(host: "0.0.0.0", port: 8080))
        #expect(try env.seconds("S", default: .seconds(1)) == .milliseconds(1500))
        #expect(HostPort("nohost") == nil)
    }
}

@Suite struct JSONValueTests {
    @Test func decodesEveryKindAndKeepsIntegersIntegral() throws {
        let text = #"{"a":true,"b":1,"c":1.5,"d":"x","e":null,"f":[1,"y"],"g":{"h":false}}"#
        let value = try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))
        #expect(value["a"] == .bool(true))
        #expect(value["b"] == .number(1))
        #expect(value["e"] == .null)
        #expect(value["g"]?["h"] == .bool(false))
        #expect(String(decoding: value.encoded(), as: UTF8.self) == text)
    }
}
