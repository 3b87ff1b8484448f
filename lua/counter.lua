-- Shared head of the scripts of Redisson's counters (prepended by
-- src/lua.rs): a semaphore's available permits, a count-down latch's
-- count, each a string holding an integer at the primitive's name.

-- The integer at `key`, 0 when it is missing; an error reply (nil, error) for
-- a key of another type or a string that is no integer, which nothing here
-- may change.
local function counter_value(key)
    local value = raised(redis.pcall('get', key))
    if type(value) == 'table' then
        return nil, redis.error_reply('WRONGTYPE not a counter (an integer string): ' .. key)
    end
    if not value then
        return 0
    end
    local number = tonumber(value)
    if not number or number ~= math.floor(number) then
        return nil, redis.error_reply('WRONGTYPE not a counter (an integer string): ' .. key)
    end
    return number
end

-- The server clock in ms: leases and deadlines are the server's, never a
-- client's.
local function clock_ms()
    local now = redis.call('time')
    return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
