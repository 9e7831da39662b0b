/// Writes commands in the Redis protocol (RESP2 arrays of bulk strings).
///
/// Commands are encoded by the calling task, so the connection thread only concatenates ready bytes and hands
/// them to hiredis with one `redisAppendFormattedCommand` per call.
struct RESPEncoder {
    private(set) var bytes: [UInt8] = []
    private(set) var commandCount = 0

    init(capacity: Int = 64) {
        bytes.reserveCapacity(capacity)
    }

    mutating func append(_ arguments: [String]) {
        precondition(!arguments.isEmpty, "a Redis command needs at least its name")
        header(UInt8(ascii: "*"), arguments.count)
        for argument in arguments { bulk(argument) }
        commandCount += 1
    }

    /// One command whose arguments are `head`, then `keys`, then `args` (`EVALSHA <sha> <n> keys… args…`),
    /// without first concatenating them into one array.
    mutating func append(_ head: [String], _ keys: [String], _ args: [String]) {
        precondition(!head.isEmpty, "a Redis command needs at least its name")
        header(UInt8(ascii: "*"), head.count + keys.count + args.count)
        for argument in head { bulk(argument) }
        for argument in keys { bulk(argument) }
        for argument in args { bulk(argument) }
        commandCount += 1
    }

    private mutating func bulk(_ argument: String) {
        let utf8 = argument.utf8
        header(UInt8(ascii: "$"), utf8.count)
        // A native string's bytes are copied as one buffer (a script call has two dozen arguments).
        if utf8.withContiguousStorageIfAvailable({ bytes.append(contentsOf: $0) }) == nil {
            bytes.append(contentsOf: utf8)
        }
        bytes.append(13)
        bytes.append(10)
    }

    mutating func append(_ arguments: [[UInt8]]) {
        precondition(!arguments.isEmpty, "a Redis command needs at least its name")
        header(UInt8(ascii: "*"), arguments.count)
        for argument in arguments {
            header(UInt8(ascii: "$"), argument.count)
            bytes.append(contentsOf: argument)
            bytes.append(13)
            bytes.append(10)
        }
        commandCount += 1
    }

    /// Every command `other` holds, after this one's.
    mutating func append(encoded other: RESPEncoder) {
        bytes.append(contentsOf: other.bytes)
        commandCount += other.commandCount
    }

    /// `<marker><decimal>\r\n` without going through String formatting.
    private mutating func header(_ marker: UInt8, _ value: Int) {
        bytes.append(marker)
        if value < 10 {  // most argument counts and many lengths: no division loop
            bytes.append(UInt8(ascii: "0") + UInt8(value))
            bytes.append(13)
            bytes.append(10)
            return
        }
        var divisor = 1
        while divisor <= value / 10 { divisor *= 10 }
        var remaining = value
        while divisor > 0 {
            bytes.append(UInt8(ascii: "0") + UInt8(remaining / divisor))
            remaining %= divisor
            divisor /= 10
        }
        bytes.append(13)
        bytes.append(10)
    }
}
