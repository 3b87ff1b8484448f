-- The fenced lock: Redisson's RFencedLock, the reentrant lock (lock.lua) with
-- its own acquire, composed after holds.lua by src/lock/fenced.rs; its other
-- scripts are the reentrant lock's.

--- script: acquire
-- Take, or take again, a fenced lock: Redisson's RFencedLock, the reentrant
-- lock (see holds.lua) plus a counter of fencing tokens, a string without
-- expiry that every first hold increments.
--
-- KEYS[1]  lock name
-- KEYS[2]  fences of lost replies
-- KEYS[3]  token counter ("redisson_lock_token:{name}")
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner field
-- ARGV[3]  the owner's holds by its client's count
-- ARGV[4]  request id, then the ids to fence
--
-- Reply: {token, afresh} for a first hold (afresh 1 when its client counted
-- holds that were gone); nil for a re-entry its client counts, which keeps the
-- token of its first hold; otherwise the lock's remaining time to live in ms
-- (-1 when it has no expiry), as the reentrant lock's acquire (lock.lua).
--
-- A missing counter (never used, or lost: a restart without persistence, an
-- eviction, a DEL) is seeded from the server clock in microseconds before it is
-- incremented, so a token issued after the loss exceeds every earlier one as
-- long as that clock never steps back and fewer than a million tokens were
-- issued per second since the counter was first seeded.

-- TIME makes the script non-deterministic: replicate its effects (Redis < 5
-- needs asking; Redis 7 always does it).
redis.replicate_commands()

if fenced(KEYS[2], 3, ARGV[2]) then
    return stale()
end

-- Checked before anything is written: INCR would fail half way on either.
local counter = KEYS[3]
local current = redis.pcall('get', counter)
if type(current) == 'table' or (current and not string.find(current, '^%d+$')) then
    return redis.error_reply('WRONGTYPE not the fencing token counter of a fenced lock (a string holding a whole number): ' .. counter)
end

local holds = tonumber(ARGV[3])
local taken = take_hold(KEYS[1], ARGV[2], holds, ARGV[1])
if taken ~= nil and taken ~= -3 then
    return taken
end
if taken == nil and holds > 0 then
    return nil
end

if not current then
    local now = redis.call('time')
    redis.call('set', counter, now[1] .. string.format('%06d', tonumber(now[2])))
end
local afresh = 0
if taken == -3 then
    afresh = 1
end
return {redis.call('incr', counter), afresh}
