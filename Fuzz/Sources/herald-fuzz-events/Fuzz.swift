import HeraldCore
import HeraldFuzzSupport
import HeraldHTTP
import HeraldRuntime

/// The producer endpoints' request handling: the first byte picks the endpoint (channel event, activity event,
/// device push); the input's first line is the path parameter (post id hash or device token), its second the
/// `Idempotency-Key` header (empty: none), the rest the body. A body becomes a whole, valid job or a 400; a job
/// ingest accepts is one the dispatcher decodes back to the same job.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size > 0 else { return 0 }
    let (heads, body) = lines(Array(UnsafeBufferPointer(start: data + 1, count: size - 1)), 2)
    let (parameter, key) = (heads[0], heads[1].isEmpty ? nil : heads[1])
    let request = HTTPRequest(method: .post, path: "/v1/apps/app1/events", route: "/v1/apps/{appID}/events",
                              body: body, requestID: "fuzz")
    let kind = data[0] % 3
    do {
        let json = try request.jsonBody()
        let job: PushJob = switch kind {
        case 0: try EventIntake.channelEvent(json, appID: "app1", jobID: key)
        case 1: try EventIntake.activityEvent(json, appID: "app1", postIDHash: parameter, jobID: key)
        default: try EventIntake.devicePush(json, appID: "app1", deviceToken: parameter, jobID: key)
        }
        require(job.appId == "app1", "job for another app")
        require(job.target.kind == [PushJob.Target.Kind.channel, .post, .device][Int(kind)], "job for another target")
        require((try? job.validate()) != nil, "accepted job does not validate")
        let dispatched: PushJob
        do { dispatched = try PushJob.decode(job.encoded()) } catch {
            fatalError("invariant broken: the dispatcher refuses an accepted job: \(error)")
        }
        require(dispatched == job, "the dispatcher decodes another job than ingest published")
    } catch let error as HTTPError {
        require(error.status == 400 && error.code == "invalid_json", "unexpected \(error)")
    } catch {
        require(error is ValidationError, "unexpected \(error)")
    }
    return 0
}
