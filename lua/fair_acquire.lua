-- Take, take again, or queue for a fair lock (see holds.lua and fair_queue.lua).
--
-- ARGV[1]  channel prefix
-- ARGV[2]  unlock message
-- ARGV[3]  lease in milliseconds
-- ARGV[4]  owner field
-- ARGV[5]  place lifetime in milliseconds: how long a queued waiter keeps its
--          place without trying again; it joins (or stays in) the queue if the
--          lock cannot be had now. 0 makes a single attempt that leaves no trace.
-- ARGV[6]  the owner's holds by its client's count
-- ARGV[7]  request id, then the ids to fence
--
-- Reply: nil when the caller holds the lock after this call (-3 when that is a
-- first hold although its client counted more). Otherwise the
-- longest the caller should sleep before trying again, in ms: the lock's TTL
-- (-1 when it has none) or, when the lock is free but an earlier waiter comes
-- first, when that waiter's place expires.
local name, queue, timeouts = KEYS[1], KEYS[2], KEYS[3]
local channel, message = ARGV[1], ARGV[2]
local lease, owner, place, holds = ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])

-- Everything read before anything is written. EXISTS first, for a free lock;
-- on a held one HEXISTS raises WRONGTYPE on a key of another type.
local now = server_now()
local previous_head, expired, wrong = read_line(queue, timeouts, now)
if wrong then
    return wrong
end
local free = redis.call('exists', name) == 0
local reentry = not free and redis.call('hexists', name, owner) == 1
if fenced(KEYS[4], 6, owner) then
    return stale()
end
local head = purge(queue, timeouts, now, previous_head, expired, owner)

if reentry or (free and (not head or head == owner)) then
    if head == owner then
        redis.call('lpop', queue)
        redis.call('zrem', timeouts, owner)
    end
    return grant_hold(name, owner, holds, lease, reentry)
end

if place > 0 then
    if redis.call('zadd', timeouts, now + place, owner) == 1 then
        redis.call('rpush', queue, owner)
    end
    -- The line's keys outlive its last place, by at most two places, so waiters
    -- that all died leave no garbage for long. Extended only when they would not
    -- outlive this one: most waiters find them long enough.
    if redis.call('pttl', timeouts) < place then
        local last = redis.call('zrange', timeouts, -1, -1, 'withscores')
        local keep = math.max(tonumber(last[2]) - now, 2 * place)
        redis.call('pexpire', queue, keep)
        redis.call('pexpire', timeouts, keep)
    end
end

if not free then
    return redis.call('pttl', name)
end

-- Free, and an earlier waiter comes first. If the purge just made it the head,
-- nobody has told it yet.
if head ~= previous_head then
    redis.call(PUBLISH, channel .. ':' .. head, message)
end
return math.max(tonumber(redis.call('zscore', timeouts, head)) - now, 1)
