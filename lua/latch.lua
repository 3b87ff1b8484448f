-- A count-down latch: Redisson's RCountDownLatch layout. Every script of the
-- primitive is here: the head below goes first (after counter.lua), then one
-- section per script (src/lua.rs composes them).
--
--   KEYS[1]  latch name: string holding the count; a missing key counts zero
--   KEYS[2]  channel ("redisson_countdownlatch__channel__{name}"): '0' when
--            the count reaches zero (every waiter wakes), '1' on a new count

local counter, channel = KEYS[1], KEYS[2]
local ZERO_MESSAGE, NEW_COUNT_MESSAGE = '0', '1'

--- script: try_set_count
-- ARGV[1]  the count
--
-- Sets the count only on a latch that has none (no key); reply 1 when it did.
if redis.call('exists', counter) == 1 then
    return 0
end
redis.call('set', counter, ARGV[1])
redis.call(PUBLISH, channel, NEW_COUNT_MESSAGE)
return 1

--- script: count_down
-- Reply: the count left (0 once it reached zero, the key deleted).
local count, wrong = counter_value(counter)
if wrong then
    return wrong
end
if count <= 0 then
    return 0
end
count = redis.call('decr', counter)
if count <= 0 then
    redis.call('del', counter)
    redis.call(PUBLISH, channel, ZERO_MESSAGE)
    return 0
end
return count

--- script: delete
-- Deletes the latch, releasing its waiters; reply 1 when it existed.
local _, wrong = counter_value(counter)
if wrong then
    return wrong
end
if redis.call('del', counter) == 0 then
    return 0
end
redis.call(PUBLISH, channel, ZERO_MESSAGE)
return 1

--- script: check
-- Reply: nil when the count is zero (or the latch missing), -1 otherwise: a
-- waiter sleeps until the zero message, a watchdog period at most.
local count, wrong = counter_value(counter)
if wrong then
    return wrong
end
if count <= 0 then
    return nil
end
return -1

--- script: inspect
-- Reads the latch for an inspection (see inspect.lua for the reply). Tail:
-- its count, or ''.
local kind = redis.call('type', counter)['ok']
if kind ~= 'none' and kind ~= 'string' then
    return redis.error_reply('WRONGTYPE not a counter (an integer string): ' .. counter)
end
return {clock_ms(), existing({counter}), {}, {}, counter_of(counter)}
