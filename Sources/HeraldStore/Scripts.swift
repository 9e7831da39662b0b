import HeraldRedis

/// The Lua scripts of the data model. ARGV[1] is always the app's key prefix (`herald:{app}:`); index keys of
/// records are derived from it and from stored fields, all in the app's hash slot.
enum Scripts {
    /// KEYS: subscription, channel index, device index, [previous token's index], [rate-limit counters].
    /// ARGV: prefix, id, channel, token, tokenType, environment, activityID, metadata, now (RFC 3339), now (ms),
    /// previousToken ("" for none), channel target (`ChannelTarget.encoded`: the channel index's value for this
    /// subscription), then the rate-limit window's `scriptArguments` (counter "" to count nothing).
    /// Returns {created (0/1), createdAt, count, ceilingCount}; {-1, "", count, ceilingCount} when a count is over
    /// its limit, having changed nothing else.
    ///
    /// `createdAt` is read before the one HSET that writes the subscription (with it when new), so an update costs
    /// no second read; the record's own keys come from KEYS rather than being concatenated again here.
    static let upsert = RedisScript(source: RateLimiter.countingLua(first: 13) + """

        if refused then return {-1, '', count, ceilingCount} end
        local p, id, channel, token, ttype = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
        local previous = ARGV[11]
        if previous ~= '' then
          local prevDev = p .. 'dev:' .. previous
          for _, sid in ipairs(redis.call('SMEMBERS', prevDev)) do
            local sk = p .. 'sub:' .. sid
            local f = redis.call('HMGET', sk, 'tokenType', 'channel')
            if f[1] == ttype then
              redis.call('DEL', sk)
              redis.call('SREM', prevDev, sid)
              redis.call('HDEL', p .. 'ch:' .. f[2], sid)
            elseif not f[1] then
              redis.call('SREM', prevDev, sid)
            end
          end
        end
        local key = KEYS[1]
        local createdAt = redis.call('HGET', key, 'createdAt')
        local created = createdAt and 0 or 1
        createdAt = createdAt or ARGV[9]
        redis.call('HSET', key, 'createdAt', createdAt, 'id', id, 'channel', channel, 'deviceToken', token,
                   'tokenType', ttype, 'environment', ARGV[6], 'activityID', ARGV[7], 'metadata', ARGV[8],
                   'updatedAt', ARGV[9], 'updatedMs', ARGV[10])
        -- Always rewritten: an update may change the environment or activityID a push needs.
        redis.call('HSET', KEYS[2], id, ARGV[12])
        redis.call('SADD', KEYS[3], id)
        return {created, createdAt, count, ceilingCount}
        """)

    /// ARGV: prefix, token, only (one subscription id, or "" for all), keepAfterMs ("" for none), unused.
    /// Removes the token's subscriptions (all, or the one), keeping those updated after keepAfterMs.
    /// Returns how many were removed.
    static let removeToken = RedisScript(source: """
        local p, token, only, keepAfter = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
        local dev = p .. 'dev:' .. token
        local ids = only ~= '' and {only} or redis.call('SMEMBERS', dev)
        local removed = 0
        for _, sid in ipairs(ids) do
          local sk = p .. 'sub:' .. sid
          local f = redis.call('HMGET', sk, 'channel', 'updatedMs', 'deviceToken')
          if f[1] and f[3] == token and not (keepAfter and tonumber(f[2]) > keepAfter) then
            redis.call('DEL', sk)
            redis.call('SREM', dev, sid)
            redis.call('HDEL', p .. 'ch:' .. f[1], sid)
            removed = removed + 1
          elseif not f[1] then
            redis.call('SREM', dev, sid)
          end
        end
        return removed
        """)
}
