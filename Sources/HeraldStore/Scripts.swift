import HeraldRedis

/// The Lua scripts of the subscription model. `upsert` and `removeSubscription` touch the keys of one device (its
/// records and its index, one hash slot) and, on a standalone Redis only, the channel and expiry index entries of
/// the subscription: on a cluster those live in other slots and `SubscriptionStore` writes them in steps of their
/// own, with the scripts that touch one channel's keys.
enum Scripts {
    /// KEYS: a channel's index (a hash) or a post's (a sorted set). ARGV: HSCAN or ZSCAN, the cursor, the count.
    /// Returns the command's reply, {cursor, items}, and, unless the whole index came at once, the first 12 hex
    /// digits of the answering Redis process's `run_id` as a third element (none when the ACL refuses `INFO`): a
    /// cursor is only good on the process that gave it, as each hashes with a seed of its own.
    static let scanPage = RedisScript(source: """
        local page = redis.call(ARGV[1], KEYS[1], ARGV[2], 'COUNT', ARGV[3])
        if ARGV[2] == '0' and page[1] == '0' then return page end
        local info = redis.pcall('INFO', 'server')
        if type(info) == 'string' then page[3] = string.sub(string.match(info, 'run_id:(%x+)') or '', 1, 12) end
        return page
        """)

    /// A `scanPage` reply's parts: the next cursor, the scan's items as Redis gave them, and the server it names;
    /// nil when the reply is not of that form.
    static func page(_ reply: RedisValue) -> (cursor: String, items: RedisValue, server: String?)? {
        guard case .array(let parts) = reply, parts.count == 2 || parts.count == 3, let cursor = parts[0].string else {
            return nil
        }
        let server = parts.count == 3 ? parts[2].string.flatMap { $0.isEmpty ? nil : $0 } : nil
        return (cursor, parts[1], server)
    }

    /// KEYS: subscription, device index, the device's removed versions, then on a standalone Redis the channel
    /// index, the expiry index and the rate-limit counters.
    /// ARGV: id, channel, token, tokenType, environment, activityID, metadata, now (RFC 3339), now (ms), channel
    /// target (`ChannelTarget.encoded`: the channel index's value for this subscription), expiresAt (UNIX seconds,
    /// "" for never), the most subscriptions a device may have, the expiry index's member (`<id><token>`), "1" to
    /// write the channel and expiry index entries here ("0": the caller does, after), then the rate-limit window's
    /// `scriptArguments` (counter "" to count nothing).
    /// Returns {created (0/1), createdAt, count, ceilingCount, updatedMs}; {-1, "", count, ceilingCount, ""} when a
    /// count is over its limit and {-2, "", count, ceilingCount, ""} when a new subscription would pass the device's
    /// cap, having changed nothing else.
    ///
    /// `createdAt` and the version are read before the one HSET that writes the subscription (with `createdAt` when
    /// new), so an update costs no second read. The version (`updatedMs`) is the write's millisecond, or one past
    /// the record's, or on a cluster past the one a removal deleted, when that is not later (another pod's clock
    /// ahead): a subscription's versions only grow, which the removal markers of a cluster rely on (`unindexTarget`).
    static let upsert = RedisScript(source: RateLimiter.countingLua(first: 15) + """

        if refused then return {-1, '', count, ceilingCount, ''} end
        local id, expiresAt = ARGV[1], ARGV[11]
        local key = KEYS[1]
        local stored = redis.call('HMGET', key, 'createdAt', 'updatedMs')
        local createdAt = stored[1]
        if not createdAt and redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[12]) then
          return {-2, '', count, ceilingCount, ''}
        end
        local created = createdAt and 0 or 1
        createdAt = createdAt or ARGV[8]
        local updatedMs = ARGV[9]
        local floor = tonumber(stored[2] or '')
        if not floor and ARGV[14] == '0' then floor = tonumber(redis.call('HGET', KEYS[3], id) or '') end
        if floor and floor >= tonumber(updatedMs) then updatedMs = string.format('%.0f', floor + 1) end
        redis.call('HSET', key, 'createdAt', createdAt, 'id', id, 'channel', ARGV[2], 'deviceToken', ARGV[3],
                   'tokenType', ARGV[4], 'environment', ARGV[5], 'activityID', ARGV[6], 'metadata', ARGV[7],
                   'updatedAt', ARGV[8], 'updatedMs', updatedMs, 'expiresAt', expiresAt)
        redis.call('SADD', KEYS[2], id)
        if ARGV[14] == '1' then
          -- Always rewritten: an update may change the environment, activityID or expiry a push needs.
          redis.call('HSET', KEYS[4], id, ARGV[10])
          if expiresAt ~= '' then redis.call('ZADD', KEYS[5], expiresAt, ARGV[13]) else redis.call('ZREM', KEYS[5], ARGV[13]) end
        end
        return {created, createdAt, count, ceilingCount, updatedMs}
        """)

    /// KEYS: subscription, device index, channel index, expiry index. ARGV: id, the subscription's `updatedMs` when
    /// it was read ("" when it was missing), its expiry index member (`<id><token>`).
    /// A removal on a standalone Redis, in one step: the record, its device index entry and its channel and expiry
    /// index entries go together, unless the record was written since it was read (an upsert racing the removal
    /// wins, and keeps all four). Returns 1 when the record went, else 0.
    static let removeSubscription = RedisScript(source: """
        local seen = redis.call('HGET', KEYS[1], 'updatedMs') or ''
        if seen ~= ARGV[2] then return 0 end
        redis.call('SREM', KEYS[2], ARGV[1])
        redis.call('HDEL', KEYS[3], ARGV[1])
        redis.call('ZREM', KEYS[4], ARGV[3])
        if seen == '' then return 0 end
        redis.call('DEL', KEYS[1])
        return 1
        """)

    /// KEYS: subscription, device index, the device's removed versions. ARGV: id, the subscription's `updatedMs`
    /// when it was read ("" when it was missing), the removed version's lifetime (seconds).
    /// A removal's last step on a cluster: the record and its device index entry, unless the record was written
    /// since it was read, keeping the version it deleted for the next upsert to start past. Returns 1 when the
    /// record went; {tokenType, environment, activityID, expiresAt,
    /// updatedMs} of a record kept that way, whose channel entry the removal's first step may have taken and
    /// must put back; else 0.
    static let removeRecord = RedisScript(source: """
        local seen = redis.call('HGET', KEYS[1], 'updatedMs') or ''
        if seen ~= ARGV[2] then
          if seen == '' then return 0 end
          return redis.call('HMGET', KEYS[1], 'tokenType', 'environment', 'activityID', 'expiresAt', 'updatedMs')
        end
        redis.call('SREM', KEYS[2], ARGV[1])
        if seen == '' then return 0 end
        redis.call('DEL', KEYS[1])
        redis.call('HSET', KEYS[3], ARGV[1], seen)
        redis.call('EXPIRE', KEYS[3], ARGV[3])
        return 1
        """)

    /// KEYS: a channel index, then the removal markers of its current ten minutes (`RedisKeys.channelRemovals`).
    /// ARGV: id, the subscription's `updatedMs` as read ("" when the record was missing), the markers' lifetime
    /// (seconds).
    /// A removal's first step on a cluster: takes the channel index entry and, for a record that was read, marks
    /// the versions up to it removed (the marker holds the highest removed version of each id), so an upsert of
    /// that version or an older one still on its way to the index (it wrote the record before the removal read
    /// it) does not write an entry for the record the removal is about to delete.
    static let unindexTarget = RedisScript(source: """
        redis.call('HDEL', KEYS[1], ARGV[1])
        if ARGV[2] ~= '' then
          local removed = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '')
          if not removed or tonumber(ARGV[2]) > removed then redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
          redis.call('EXPIRE', KEYS[2], ARGV[3])
        end
        return 1
        """)

    /// KEYS: a channel index, then the removal markers of the ten minutes before, during and after now.
    /// ARGV: id, the channel target (`ChannelTarget.encoded`), the subscription's `updatedMs`, "1" to write only
    /// where the entry is missing.
    /// An upsert's last step on a cluster (and a removal's putting back of an entry it took from a record written
    /// since): writes the entry unless that version, or a later one, was marked removed. Returns 1 when written,
    /// else 0.
    static let indexTarget = RedisScript(source: """
        local version = tonumber(ARGV[3])
        for i = 2, #KEYS do
          local removed = tonumber(redis.call('HGET', KEYS[i], ARGV[1]) or '')
          if removed and version and removed >= version then return 0 end
        end
        if ARGV[4] == '1' then return redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) end
        redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
        return 1
        """)

    /// KEYS: a channel index. ARGV: a subscription id, now (UNIX seconds).
    /// The sweep's removal of a channel index entry: only an entry whose expiry has passed goes, so a renewal
    /// written since the sweep read the record (a later expiry, or none) keeps its entry. Returns 1 when it went.
    static let unindexExpiredTarget = RedisScript(source: """
        local target = redis.call('HGET', KEYS[1], ARGV[1])
        local expiresAt = target and string.match(target, '^..~(%d+)~')
        if not expiresAt or tonumber(expiresAt) > tonumber(ARGV[2]) then return 0 end
        return redis.call('HDEL', KEYS[1], ARGV[1])
        """)

    /// KEYS: an expiry index bucket. ARGV: a member (`<id><token>`), now (UNIX seconds).
    /// The sweep's removal of an expiry entry: only one whose score (the expiry) has passed goes. Returns 1 when
    /// it went.
    static let unindexExpiredEntry = RedisScript(source: """
        local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
        if not score or tonumber(score) > tonumber(ARGV[2]) then return 0 end
        return redis.call('ZREM', KEYS[1], ARGV[1])
        """)
}
