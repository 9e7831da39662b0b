/// Input that breaks a rule of the API or the job format. Rendered by the HTTP layer as a 400 with
/// `{"error": {"code", "message", "field"}}`, and by the dispatcher as an `invalid_job` dead letter.
public struct ValidationError: Error, Equatable, Sendable, CustomStringConvertible {
    /// snake_case, stable for clients (`invalid_field`, `missing_field`, …).
    public var code: String
    public var message: String
    /// The field at fault, as the client named it (`channel`, `liveActivity.event`).
    public var field: String?

    public init(code: String, message: String, field: String? = nil) {
        self.code = code
        self.message = message
        self.field = field
    }

    public static func missing(_ field: String) -> ValidationError {
        ValidationError(code: "missing_field", message: "\(field) is required", field: field)
    }

    public static func invalid(_ field: String, _ message: String) -> ValidationError {
        ValidationError(code: "invalid_field", message: message, field: field)
    }

    public var description: String { field.map { "\($0): \(message)" } ?? message }
}
