-- A semaphore whose permits are leases: Redisson's RPermitExpirableSemaphore
-- layout, timed by the server's clock. Every script of the primitive is here:
-- the head below goes first (after fences.lua and counter.lua), then one
-- section per script (src/lua.rs composes them).
--
--   KEYS[1]  semaphore name: string holding the permits available (Redisson's)
--   KEYS[2]  leases ("{name}:timeout"): zset of permit id -> when its lease
--            ends, in ms; fredlock's ids are "<client uuid>:<id>" by the
--            server's clock, Redisson's 16 bytes by its client's clock
--            (922337203685477 for a permit without lease)
--   KEYS[3]  channel ("redisson_sc:{name}"): every change publishes the new
--            number of permits available
--   KEYS[4]  fences of lost replies (see fences.lua)
--
-- Every script that changes the semaphore first gives back the permits whose
-- leases ended (as Redisson's do), so a dead holder's permit returns at the
-- next call once its lease is over.

redis.replicate_commands()

local counter, leases, channel, fences = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
-- Redisson's score of a permit taken without a lease.
local NEVER = 922337203685477
-- Ended leases given back per ZREM, to keep within Lua's stack.
local RECLAIM_BATCH = 1000

-- Gives back the permits whose leases ended by `now`, publishing the new
-- count when there were any.
local function reclaim(now)
    local available
    while true do
        local ended = redis.call('zrangebyscore', leases, '-inf', now, 'LIMIT', 0, RECLAIM_BATCH)
        if #ended == 0 then
            break
        end
        redis.call('zrem', leases, unpack(ended))
        available = redis.call('incrby', counter, #ended)
    end
    if available then
        redis.call(PUBLISH, channel, available)
    end
end

-- The counter checked (an error reply for a key that is no counter, before
-- anything is written) and the ended leases given back: the server's clock.
local function prepare()
    local _, wrong = counter_value(counter)
    if wrong then
        return nil, wrong
    end
    local kind = redis.call('type', leases)['ok']
    if kind ~= 'none' and kind ~= 'zset' then
        return nil, redis.error_reply('WRONGTYPE not the leases of a semaphore (a zset): ' .. leases)
    end
    local now = clock_ms()
    reclaim(now)
    return now
end

-- Gives back permit `id` if it is held: true when it was.
local function give_back(id)
    if redis.call('zrem', leases, id) == 0 then
        return false
    end
    redis.call(PUBLISH, channel, redis.call('incr', counter))
    return true
end

--- script: acquire
-- ARGV[1]  lease in ms
-- ARGV[2]  permit id, new for each acquisition
-- ARGV[3]  request id, then the ids to fence
--
-- Reply: nil when the permit is taken (now, or by an earlier send of this
-- acquisition whose reply was lost: its lease then starts again); otherwise how long (ms) until the
-- earliest lease ends, -1 when none ends by time (a release publishes).
local halted = fenced(fences, 2, ARGV[2])
if halted then
    return halted
end
local now, wrong = prepare()
if wrong then
    return wrong
end
if redis.call('zscore', leases, ARGV[2]) then
    -- Its client counts the lease from this send, so the lease starts again
    -- now, as a lock's acquire sets its expiry on every hold (left as it was,
    -- it would end before the client's renew deadline: tests/model.rs).
    redis.call('zadd', leases, now + tonumber(ARGV[1]), ARGV[2])
    return nil
end
if tonumber(redis.call('get', counter) or '0') >= 1 then
    redis.call('decr', counter)
    redis.call('zadd', leases, now + tonumber(ARGV[1]), ARGV[2])
    return nil
end
local first = redis.call('zrange', leases, 0, 0, 'WITHSCORES')
if first[2] and tonumber(first[2]) < NEVER then
    return math.max(tonumber(first[2]) - now, 1)
end
return -1

--- script: release
-- ARGV[1]  permit id
-- ARGV[2]  holds the permit keeps: 0 gives it back; more keeps it (a settle
--          of a permit whose guard lives)
-- ARGV[3]  request id, then the ids to fence
--
-- Reply: nil when the permit is not held (its lease ended, or it was given
-- back already), 0 when it is kept, 1 when it was given back.
local halted = fenced(fences, 2, ARGV[1])
if halted then
    return halted
end
local _, wrong = prepare()
if wrong then
    return wrong
end
if not redis.call('zscore', leases, ARGV[1]) then
    return nil
end
if tonumber(ARGV[2]) > 0 then
    return 0
end
give_back(ARGV[1])
return 1

--- script: release_by_id
-- ARGV[1]  permit id, whoever took it
--
-- Reply: 1 when it was held and is given back, 0 otherwise.
local _, wrong = prepare()
if wrong then
    return wrong
end
if give_back(ARGV[1]) then
    return 1
end
return 0

--- script: available
-- Reply: the permits available, after giving back those whose leases ended.
local _, wrong = prepare()
if wrong then
    return wrong
end
return tonumber(redis.call('get', counter) or '0')

--- script: renew
-- Extend (or check) many leases in one call. A lease is extended only while
-- it has not ended, so a renewal never brings back a permit that was given
-- back or whose lease ran out.
--
-- KEYS[i]    leases zsets (all in one cluster slot)
-- ARGV[1]    lease in ms; 0 only checks that each permit is still held
-- ARGV[i+1]  permit id in KEYS[i]
--
-- Reply: one integer per key, 1 = extended (or still held), 0 = not held.
local now = clock_ms()
local renewed = {}
for i, key in ipairs(KEYS) do
    local ends = raised(redis.pcall('zscore', key, ARGV[i + 1]))
    if type(ends) == 'string' and tonumber(ends) > now then
        if ARGV[1] ~= '0' then
            redis.call('zadd', key, 'XX', now + tonumber(ARGV[1]), ARGV[i + 1])
        end
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed

--- script: inspect
-- Reads the semaphore for an inspection (see inspect.lua for the reply): each
-- live lease as a holder with its remaining time ('' for a permit without
-- lease). Tail: the permits available (or ''), then the leases that ended
-- but were not given back yet, {permit, when it ended (ms), ..}. Ids that are no text (Redisson's 16
-- bytes) are shown in hex, as Redisson writes them.
local function shown(id)
    if string.find(id, '[^%w%p ]') then
        return (string.gsub(id, '.', function(c)
            return string.format('%02x', string.byte(c))
        end))
    end
    return id
end
local kind = redis.call('type', counter)['ok']
if kind ~= 'none' and kind ~= 'string' then
    return redis.error_reply('WRONGTYPE not a counter (an integer string): ' .. counter)
end
local now = clock_ms()
local holders, ended = {}, {}
if redis.call('type', leases)['ok'] == 'zset' then
    local all = redis.call('zrange', leases, 0, -1, 'WITHSCORES')
    for i = 1, #all, 2 do
        local ends = tonumber(all[i + 1])
        if ends > now then
            holders[#holders + 1] = shown(all[i])
            holders[#holders + 1] = 1
            if ends >= NEVER then
                holders[#holders + 1] = -1
            else
                holders[#holders + 1] = ends - now
            end
        else
            ended[#ended + 1] = shown(all[i])
            ended[#ended + 1] = ends
        end
    end
end
return {now, existing({counter, leases}), holders, {}, counter_of(counter), ended}
