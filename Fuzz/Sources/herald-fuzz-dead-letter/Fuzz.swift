import HeraldCore
import HeraldRuntime

/// The dead-letter decoder (`heraldctl dlq` and `replay` read `herald.dlq` with it): a record becomes a dead
/// letter or an error; a decoded one encodes to a record that decodes to the same dead letter, and the replay
/// job it gives (if any) decodes back as the dispatcher would read it.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    guard let letter = try? DeadLetter.decode(bytes) else { return 0 }
    let again: DeadLetter
    do { again = try DeadLetter.decode(letter.encoded()) } catch {
        fatalError("invariant broken: a decoded dead letter's encoding does not decode: \(error)")
    }
    if again != letter { fatalError("invariant broken: decode → encode → decode changed the dead letter") }
    _ = letter.recordKey
    if let replay = letter.replayJob(partition: 0, offset: 0, id: "replay-1") {
        do {
            let read = try PushJob.decode(replay.encoded())
            if read != replay { fatalError("invariant broken: the replay job decodes to another job") }
        } catch {
            fatalError("invariant broken: the replay job does not decode: \(error)")
        }
    }
    return 0
}
