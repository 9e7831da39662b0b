import HeraldRedis

/// The Lua scripts of the data model. ARGV[1] is always the app's key prefix (`herald:{app}:`); index keys of
/// records are derived from it and from stored fields, all in the app's hash slot.
enum Scripts {
    /// KEYS: subscription, channel index, device index, expiry index, [previous token's index], [rate-limit
    /// counters].
    /// ARGV: prefix, id, channel, token, tokenType, environment, activityID, metadata, now (RFC 3339), now (ms),
    /// previousToken ("" for none), channel target (`ChannelTarget.encoded`: the channel index's value for this
    /// subscription), expiresAt (UNIX seconds, "" for never), the most subscriptions a device may have, then the
    /// rate-limit window's `scriptArguments` (counter "" to count nothing).
    /// Returns {created (0/1), createdAt, count, ceilingCount}; {-1, "", count, ceilingCount} when a count is over
    /// its limit and {-2, "", count, ceilingCount} when a new subscription would pass the device's cap, having
    /// changed nothing else.
    ///
    /// `createdAt` is read before the one HSET that writes the subscription (with it when new), so an update costs
    /// no second read; the record's own keys come from KEYS rather than being concatenated again here.
    static let upsert = RedisScript(source: RateLimiter.countingLua(first: 15) + """

        if refused then return {-1, '', count, ceilingCount} end
        local p, id, channel, token, ttype = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
        local previous, expiresAt = ARGV[11], ARGV[13]
        local key = KEYS[1]
        local createdAt = redis.call('HGET', key, 'createdAt')
        if not createdAt and redis.call('SCARD', KEYS[3]) >= tonumber(ARGV[14]) then
          return {-2, '', count, ceilingCount}
        end
        if previous ~= '' then
          local prevDev = p .. 'dev:' .. previous
          for _, sid in ipairs(redis.call('SMEMBERS', prevDev)) do
            local sk = p .. 'sub:' .. sid
            local f = redis.call('HMGET', sk, 'tokenType', 'channel')
            if f[1] == ttype then
              redis.call('DEL', sk)
              redis.call('SREM', prevDev, sid)
              redis.call('HDEL', p .. 'ch:' .. f[2], sid)
              redis.call('ZREM', KEYS[4], sid)
            elseif not f[1] then
              redis.call('SREM', prevDev, sid)
            end
          end
        end
        local created = createdAt and 0 or 1
        createdAt = createdAt or ARGV[9]
        redis.call('HSET', key, 'createdAt', createdAt, 'id', id, 'channel', channel, 'deviceToken', token,
                   'tokenType', ttype, 'environment', ARGV[6], 'activityID', ARGV[7], 'metadata', ARGV[8],
                   'updatedAt', ARGV[9], 'updatedMs', ARGV[10], 'expiresAt', expiresAt)
        -- Always rewritten: an update may change the environment, activityID or expiry a push needs.
        redis.call('HSET', KEYS[2], id, ARGV[12])
        redis.call('SADD', KEYS[3], id)
        if expiresAt ~= '' then redis.call('ZADD', KEYS[4], expiresAt, id) else redis.call('ZREM', KEYS[4], id) end
        return {created, createdAt, count, ceilingCount}
        """)

    /// KEYS: device index, expiry index. ARGV: prefix, token, only (one subscription id, or "" for all),
    /// keepAfterMs ("" for none), cursor, batch size.
    /// Removes the token's subscriptions (the one, or the next batch of all of them: `SSCAN` from the cursor, so a
    /// device with many never holds Redis long), keeping those updated after keepAfterMs.
    /// Returns {removed, next cursor ("0" when done)}.
    static let removeToken = RedisScript(source: """
        local p, token, only, keepAfter = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
        local dev = KEYS[1]
        local ids, nextCursor = {only}, '0'
        if only == '' then
          local page = redis.call('SSCAN', dev, ARGV[5], 'COUNT', ARGV[6])
          nextCursor, ids = page[1], page[2]
        end
        local removed = 0
        for _, sid in ipairs(ids) do
          local sk = p .. 'sub:' .. sid
          local f = redis.call('HMGET', sk, 'channel', 'updatedMs', 'deviceToken')
          if f[1] and f[3] == token and not (keepAfter and tonumber(f[2]) > keepAfter) then
            redis.call('DEL', sk)
            redis.call('SREM', dev, sid)
            redis.call('HDEL', p .. 'ch:' .. f[1], sid)
            redis.call('ZREM', KEYS[2], sid)
            removed = removed + 1
          elseif not f[1] then
            redis.call('SREM', dev, sid)
          end
        end
        return {removed, nextCursor}
        """)

    /// KEYS: channel index, expiry index. ARGV: prefix, cursor, batch size.
    /// Removes the next batch of the channel's subscriptions (`HSCAN` from the cursor) from every index.
    /// Returns {removed, next cursor ("0" when done)}.
    static let removeChannel = RedisScript(source: """
        local p, channelIndex = ARGV[1], KEYS[1]
        local page = redis.call('HSCAN', channelIndex, ARGV[2], 'COUNT', ARGV[3])
        local entries, removed = page[2], 0
        for i = 1, #entries, 2 do
          local sid = entries[i]
          local sk = p .. 'sub:' .. sid
          local token = redis.call('HGET', sk, 'deviceToken')
          if token then
            redis.call('DEL', sk)
            redis.call('SREM', p .. 'dev:' .. token, sid)
            removed = removed + 1
          end
          redis.call('HDEL', channelIndex, sid)
          redis.call('ZREM', KEYS[2], sid)
        end
        return {removed, page[1]}
        """)

    /// KEYS: expiry index. ARGV: prefix, now (UNIX seconds), batch size.
    /// Removes up to a batch of subscriptions whose expiry has passed (not renewed since) from every index.
    /// Returns {removed, looked at}.
    static let expire = RedisScript(source: """
        local p, now = ARGV[1], tonumber(ARGV[2])
        local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, ARGV[3])
        local removed = 0
        for _, sid in ipairs(ids) do
          local sk = p .. 'sub:' .. sid
          local f = redis.call('HMGET', sk, 'channel', 'deviceToken', 'expiresAt')
          if f[1] and f[3] and f[3] ~= '' and tonumber(f[3]) > now then
            redis.call('ZADD', KEYS[1], f[3], sid) -- renewed: its score is its expiry again
          else
            if f[1] then
              redis.call('DEL', sk)
              redis.call('HDEL', p .. 'ch:' .. f[1], sid)
              redis.call('SREM', p .. 'dev:' .. f[2], sid)
              removed = removed + 1
            end
            redis.call('ZREM', KEYS[1], sid)
          end
        end
        return {removed, #ids}
        """)
}
