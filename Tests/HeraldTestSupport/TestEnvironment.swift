import Foundation

/// What `scripts/test` provides to integration tests. A missing variable fails the test (never a silent skip).
public enum TestEnvironment {
    public struct Missing: Error, CustomStringConvertible {
        public let description: String
    }

    public static func redisURL() throws -> String { try value("HERALD_TEST_REDIS_URL") }
    /// Seeds of the Redis Cluster (3 masters, 3 replicas) `scripts/test` starts beside the standalone Redis.
    public static func redisClusterURL() throws -> String { try value("HERALD_TEST_REDIS_CLUSTER_URL") }
    public static func kafkaBrokers() throws -> String { try value("HERALD_TEST_KAFKA_BROKERS") }

    static func value(_ name: String) throws -> String {
        guard let value = ProcessInfo.processInfo.environment[name], !value.isEmpty else {
            throw Missing(description: "\(name) is not set: run the tests with scripts/test")
        }
        return value
    }

    /// The repository's root folder (for schemas/, scripts/ and built executables).
    public static var repositoryRoot: URL {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }
        return url
    }
}

/// Runs a command line tool to completion and returns its standard output; throws with its stderr when it fails.
public func runTool(_ tool: String, _ arguments: [String], input: Data? = nil) throws -> String {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = [tool] + arguments
    let output = Pipe(), errors = Pipe(), stdin = Pipe()
    process.standardOutput = output
    process.standardError = errors
    process.standardInput = stdin
    try process.run()
    if let input { stdin.fileHandleForWriting.write(input) }
    try stdin.fileHandleForWriting.close()
    let out = output.fileHandleForReading.readDataToEndOfFile()
    let err = errors.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    guard process.terminationStatus == 0 else {
        throw TestEnvironment.Missing(description: "\(tool) failed (\(process.terminationStatus)): \(String(decoding: err, as: UTF8.self))")
    }
    return String(decoding: out, as: UTF8.self)
}

/// Validates JSON documents (one per element) against a schema in schemas/ with Python's jsonschema.
public func validateAgainstSchema(_ documents: [[UInt8]], schema: String) throws {
    let schemaPath = TestEnvironment.repositoryRoot.appendingPathComponent("schemas/\(schema)").path
    try validate(documents, arguments: [schemaPath], validator: """
        import glob, json, os, sys, jsonschema, referencing
        schema = json.load(open(sys.argv[1]))
        jsonschema.Draft202012Validator.check_schema(schema)
        # Every schema in the folder, by its $id, so that references between them resolve.
        resources = [json.load(open(p)) for p in glob.glob(os.path.join(os.path.dirname(sys.argv[1]), "*.json"))]
        registry = referencing.Registry().with_resources(
            (r["$id"], referencing.Resource.from_contents(r)) for r in resources)
        v = jsonschema.Draft202012Validator(schema, registry=registry,
                                            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        """)
}

/// Validates JSON documents against the schema at `pointer` (a JSON pointer into schemas/openapi.yaml).
public func validateAgainstOpenAPI(_ documents: [[UInt8]], pointer: String) throws {
    let path = TestEnvironment.repositoryRoot.appendingPathComponent("schemas/openapi.yaml").path
    try validate(documents, arguments: [path, pointer], validator: """
        import json, sys, yaml, jsonschema
        document = yaml.safe_load(open(sys.argv[1]))
        schema = dict(document, **{"$ref": sys.argv[2]})
        v = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        """)
}

/// Runs `validator` (Python that sets `v`, a jsonschema validator) over the documents, one per line of its input;
/// throws with the first error of the first document that has one.
private func validate(_ documents: [[UInt8]], arguments: [String], validator: String) throws {
    let script = validator + """

        for n, line in enumerate(sys.stdin):
            errors = sorted(v.iter_errors(json.loads(line)), key=str)
            if errors: sys.exit(f"document {n}: " + errors[0].message)
        """
    var input = Data()
    for document in documents { input.append(contentsOf: document + [0x0a]) }
    _ = try runTool("python3", ["-c", script] + arguments, input: input)
}
