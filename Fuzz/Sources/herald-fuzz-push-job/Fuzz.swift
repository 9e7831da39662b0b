import HeraldCore
import HeraldRuntime

/// The dispatcher's job decoder: a `herald.jobs` record becomes a job (then valid or not) or an `invalid_job`
/// error, never a crash; a decoded job encodes to a record that decodes to the same job and judges the same.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    let job: PushJob
    do { job = try PushJob.decode(bytes) } catch {
        if error.code != "invalid_job" { fatalError("invariant broken: unexpected \(error)") }
        return 0
    }
    let again: PushJob
    do { again = try PushJob.decode(job.encoded()) } catch {
        fatalError("invariant broken: a decoded job's encoding does not decode: \(error)")
    }
    if again != job { fatalError("invariant broken: decode → encode → decode changed the job") }
    // A valid job's payloads are what the dispatcher sends: each must stay a complete JSON object.
    if (try? job.validate()) != nil {
        for payload in [job.liveActivity.map { APNsPayload.liveActivity($0, timestamp: 0) },
                        job.start.map { APNsPayload.start($0, timestamp: 0) }].compactMap({ $0 }) {
            if JSONValue(parsing: payload.encoded()) != payload { fatalError("invariant broken: payload does not round-trip") }
        }
    }
    _ = job.recordKey
    _ = job.isFinal
    return 0
}
