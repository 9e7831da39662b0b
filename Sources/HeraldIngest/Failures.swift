import HeraldCore
import HeraldHTTP
import HeraldKafka
import HeraldRedis
import HeraldRuntime

/// Maps what the layers below throw to the API's HTTP errors, in one place.
enum Failures {
    static func http(_ error: any Error, logger: Logger) -> any Error {
        switch error {
        case let error as HTTPError:
            return error
        case let error as ValidationError:
            return HTTPError(status: 400, code: error.code, message: error.message, field: error.field)
        case let error as RedisError where error.isConnectionFailure:
            logger.warning("redis unavailable", ["error": error.description])
            return HTTPError.unavailable("the subscription store cannot be reached; retry later")
        case let error as RedisError where error.isRefusingWrites:
            logger.error("redis refused a write", ["error": error.description])
            return HTTPError.unavailable("the subscription store is refusing writes; retry later")
        case let error as KafkaError:
            logger.warning("kafka publish failed", ["error": error.description])
            return HTTPError.unavailable("the job queue did not acknowledge the event in time; retry later")
        default:
            return error
        }
    }

    /// Runs `body`, turning store and queue failures into HTTP errors.
    static func mapping<T>(_ logger: Logger, _ body: () async throws -> T) async throws -> T {
        do { return try await body() } catch { throw http(error, logger: logger) }
    }
}
