-- Shared head of every inspect script (prepended by src/lua.rs): reading a
-- primitive without changing it. Every reply starts with the head the engine
-- reads (src/engine/inspect.rs):
--
--   {now, {key, pttl, ..}, {owner field, hold count, remaining lease or '',
--    ..}, {waiter field, place deadline, ..}, ..}
--
-- and goes on with the primitive's own tail, which only that primitive reads
-- (its `details`, in its src file) and its script documents: a fenced lock's
-- last token, a read-write lock's mode, a counter's value, a permit
-- semaphore's ended leases, a leader's identity and since when.
--
-- now and deadlines are the server clock in ms; pttl is -1 for a key without
-- expiry, and only keys that exist are listed. A holder's remaining lease is
-- '' when it is the main key's TTL.

local function clock_ms()
    local now = redis.call('time')
    return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

local function existing(keys)
    local found = {}
    for _, key in ipairs(keys) do
        local pttl = redis.call('pttl', key)
        if pttl ~= -2 then
            found[#found + 1] = key
            found[#found + 1] = pttl
        end
    end
    return found
end

-- The holders of a hash of holds. A key of another type is an error that names
-- it, as the lock scripts report it.
local function holders_of(hash)
    local fields = raised(redis.pcall('hgetall', hash))
    if fields['err'] then
        return nil, redis.error_reply('WRONGTYPE not a lock (a hash of holds): ' .. hash)
    end
    local holders = {}
    for i = 1, #fields, 2 do
        holders[#holders + 1] = fields[i]
        holders[#holders + 1] = fields[i + 1]
        holders[#holders + 1] = ''
    end
    return holders
end

-- A counter's value, or '' when it is missing or not a whole number.
local function counter_of(key)
    local value = raised(redis.pcall('get', key))
    if type(value) ~= 'string' or not string.find(value, '^%d+$') then
        return ''
    end
    return value
end
