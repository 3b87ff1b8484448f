-- A semaphore: Redisson's RSemaphore layout, with fredlock's own record of
-- the permits its acquisitions took. Every script of the primitive is here:
-- the head below goes first (after fences.lua and counter.lua for the
-- scripts that change it), then one section, from its "--- script:" line to
-- the next (src/lua.rs composes them).
--
--   KEYS[1]  semaphore name: string holding the permits available (Redisson's)
--   KEYS[2]  channel ("redisson_sc:{name}"): every change publishes the new
--            number of permits available
--   KEYS[3]  fences of lost replies (see fences.lua)
--   KEYS[4]  fredlock's grants: hash of grant field "<uuid>:<id>" -> permits
--            it took (Redisson never reads it; its own releases touch only
--            the counter). A grant is given back once however often its
--            release is sent, and a call that took permits is known by it.

local counter, channel, fences, grants = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

--- script: acquire
-- ARGV[1]  permits wanted (at least 1)
-- ARGV[2]  grant field, new for each acquisition
-- ARGV[3]  request id, then the ids to fence
--
-- Reply: nil when the permits are taken (now, or by an earlier send of this
-- acquisition whose reply was lost); otherwise -1: none to wait for by time,
-- a release publishes.
local halted = fenced(fences, 2, ARGV[2])
if halted then
    return halted
end
if redis.call('hexists', grants, ARGV[2]) == 1 then
    return nil
end
local available, wrong = counter_value(counter)
if wrong then
    return wrong
end
local wanted = tonumber(ARGV[1])
if available >= wanted then
    redis.call('decrby', counter, wanted)
    redis.call('hset', grants, ARGV[2], wanted)
    return nil
end
return -1

--- script: release
-- ARGV[1]  grant field
-- ARGV[2]  holds the grant keeps: 0 gives its permits back; more keeps them
--          (a settle of a grant whose guard lives)
-- ARGV[3]  request id, then the ids to fence
--
-- Reply: nil when the grant holds nothing (never took permits, or gave them
-- back already), 0 when it keeps them, 1 when they were given back.
local halted = fenced(fences, 2, ARGV[1])
if halted then
    return halted
end
local taken = redis.call('hget', grants, ARGV[1])
if not taken then
    return nil
end
if tonumber(ARGV[2]) > 0 then
    return 0
end
local _, wrong = counter_value(counter)
if wrong then
    return wrong
end
redis.call('hdel', grants, ARGV[1])
local available = redis.call('incrby', counter, taken)
redis.call(PUBLISH, channel, available)
return 1

--- script: forget
-- ARGV[1]  grant field
--
-- The grant's permits stay taken for good; only its record goes. Reply: 1
-- when there was one.
return redis.call('hdel', grants, ARGV[1])

--- script: try_set
-- ARGV[1]  permits
--
-- Sets the permits only on a semaphore that has none set (no key); reply 1
-- when it did.
if redis.call('exists', counter) == 1 then
    return 0
end
redis.call('set', counter, ARGV[1])
redis.call(PUBLISH, channel, ARGV[1])
return 1

--- script: set
-- ARGV[1]  permits
--
-- Sets the permits available, whatever they were.
local _, wrong = counter_value(counter)
if wrong then
    return wrong
end
redis.call('set', counter, ARGV[1])
redis.call(PUBLISH, channel, ARGV[1])
return 1

--- script: add
-- ARGV[1]  permits to add (Redisson's release(n) and addPermits(n): nobody's
--          in particular)
--
-- Reply: the permits available now.
local _, wrong = counter_value(counter)
if wrong then
    return wrong
end
local available = redis.call('incrby', counter, ARGV[1])
redis.call(PUBLISH, channel, available)
return available

--- script: drain
-- Takes every permit available; reply: how many it took.
local available, wrong = counter_value(counter)
if wrong then
    return wrong
end
if available <= 0 then
    return 0
end
redis.call('set', counter, 0)
return available

--- script: inspect
-- Reads the semaphore for an inspection (see inspect.lua for the reply): the
-- fredlock's grants as holders with the permits each took. Tail: the permits
-- available, or ''.
local holders = {}
if redis.call('type', grants)['ok'] == 'hash' then
    local fields = redis.call('hgetall', grants)
    for i = 1, #fields, 2 do
        holders[#holders + 1] = fields[i]
        holders[#holders + 1] = fields[i + 1]
        holders[#holders + 1] = -1
    end
end
local kind = redis.call('type', counter)['ok']
if kind ~= 'none' and kind ~= 'string' then
    return redis.error_reply('WRONGTYPE not a counter (an integer string): ' .. counter)
end
return {clock_ms(), existing({counter, grants}), holders, {}, counter_of(counter)}
