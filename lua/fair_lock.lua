-- The fair lock: Redisson's RFairLock. This head goes into every script that
-- changes the lock (after holds.lua; src/lock/fair.rs composes them), then one
-- section, from its "--- script:" line to the next. The inspection is its
-- section alone, after inspect.lua.
--
-- A fair lock is the reentrant lock's hash plus a waiting line:
--   KEYS[1]  lock name (hash: owner field -> hold count)
--   KEYS[2]  queue: list of waiter fields in arrival order
--   KEYS[3]  timeouts: zset of waiter field -> when its place expires, in ms on the
--            server's clock
--   KEYS[4]  fences of lost replies (see holds.lua), for the scripts that
--            change the lock
-- Each waiter has its own channel, "<channel prefix>:<waiter field>"; a free
-- lock is announced to the first waiter only.

-- Reading the clock makes a script non-deterministic: Redis before 5 replicates
-- such a script only by its effects, and only when asked to first. Redis 7
-- always does, and ignores the call.
redis.replicate_commands()

-- Milliseconds since the epoch by the server's clock: the one clock every
-- client agrees on.
local function server_now()
    local time = redis.call('time')
    return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- The line as it stands: its head (or false), and the waiters whose places
-- ended by `now`. Every fair-lock script reads the line with this before it
-- writes anything, in protected calls, so that a line key of the wrong type is
-- named in an error reply (in the form src/engine/refusal.rs decodes) with nothing changed.
local function read_line(queue, timeouts, now)
    local head = raised(redis.pcall('lindex', queue, 0))
    if type(head) == 'table' and head.err then
        return nil, nil, redis.error_reply('WRONGTYPE not the queue of a fair lock (a list): ' .. queue)
    end
    local expired = raised(redis.pcall('zrangebyscore', timeouts, '-inf', now))
    if expired.err then
        return nil, nil, redis.error_reply('WRONGTYPE not the place timeouts of a fair lock (a zset): ' .. timeouts)
    end
    return head, expired
end

-- Removes the waiters whose places ended (`expired`, as read_line found them),
-- wherever they stand in the queue, and any head without a place timeout
-- (which nobody could ever purge otherwise), unless it is `owner`, who is
-- here and about to take the lock or its place. Returns the first waiter after
-- that, or false.
local function purge(queue, timeouts, now, head, expired, owner)
    if #expired > 0 then
        for _, waiter in ipairs(expired) do
            redis.call('lrem', queue, 0, waiter)
        end
        redis.call('zremrangebyscore', timeouts, '-inf', now)
        head = redis.call('lindex', queue, 0)
    end
    while head and head ~= owner and not redis.call('zscore', timeouts, head) do
        redis.call('lpop', queue)
        head = redis.call('lindex', queue, 0)
    end
    return head
end

-- Tells `head`, the first waiter if there is one, that the lock is free.
local function notify_head(channel, message, head)
    if head then
        redis.call(PUBLISH, channel .. ':' .. head, message)
    end
end

--- script: acquire
-- Take, take again, or queue for a fair lock (see holds.lua and the head above).
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
local halted = fenced(KEYS[4], 6, owner, {name, queue, timeouts})
if halted then
    return halted
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

--- script: release
-- Give back holds of a fair lock (see holds.lua and the head above); when none
-- remain the lock is deleted and only the first waiter told.
--
-- ARGV[1]  channel prefix
-- ARGV[2]  unlock message
-- ARGV[3]  lease in milliseconds, applied again while holds remain (0: kept)
-- ARGV[4]  owner field
-- ARGV[5]  holds the owner keeps
-- ARGV[6]  request id, then the ids to fence
--
-- Reply: nil when the owner holds nothing, 0 when holds remain, 1 when the
-- lock was released.
local name, queue, timeouts = KEYS[1], KEYS[2], KEYS[3]
local channel, message, lease, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = server_now()
local head, expired, wrong = read_line(queue, timeouts, now)
if wrong then
    return wrong
end
local halted = fenced(KEYS[4], 5, owner)
if halted then
    return halted
end

head = purge(queue, timeouts, now, head, expired)
local released = give_back_holds(name, owner, tonumber(ARGV[5]), lease)
-- Released now, or not held at all: then the lock may have expired without a
-- word to anyone. Either way the first waiter is told if it is free.
if released == 1 or (released == nil and redis.call('exists', name) == 0) then
    notify_head(channel, message, head)
end
return released

--- script: leave
-- A waiter gives up its place in a fair lock's queue (see the head above for
-- the keys); if it was first and the lock is free, the next waiter is told.
--
-- ARGV[1]  channel prefix
-- ARGV[2]  unlock message
-- ARGV[3]  owner field
-- ARGV[4]  request id, then the ids to fence
--
-- Reply: 1 when the waiter was queued, 0 when it was not.
local name, queue, timeouts = KEYS[1], KEYS[2], KEYS[3]
local channel, message, owner = ARGV[1], ARGV[2], ARGV[3]
local now = server_now()
local head, expired, wrong = read_line(queue, timeouts, now)
if wrong then
    return wrong
end
local halted = fenced(KEYS[4], 3, owner)
if halted then
    return halted
end

head = purge(queue, timeouts, now, head, expired)
redis.call('zrem', timeouts, owner)
local removed = redis.call('lrem', queue, 0, owner)
if head == owner and redis.call('exists', name) == 0 then
    notify_head(channel, message, redis.call('lindex', queue, 0))
end
return math.min(removed, 1)

--- script: force_unlock
-- Delete a fair lock whoever holds it, and tell its first waiter (see
-- delete_lock.lua and the head above). The queue itself is kept: its waiters still
-- come in their order.
--
-- ARGV[1]  channel prefix
-- ARGV[2]  unlock message
--
-- Reply: 1 when a lock was deleted, 0 when there was none. A key of another
-- type is left alone and reported as WRONGTYPE.
local name, queue, timeouts = KEYS[1], KEYS[2], KEYS[3]
local channel, message = ARGV[1], ARGV[2]

local now = server_now()
local head, expired, wrong = read_line(queue, timeouts, now)
if wrong then
    return wrong
end
local deleted = delete_lock(name)
if deleted == 1 then
    notify_head(channel, message, purge(queue, timeouts, now, head, expired))
end
return deleted

--- script: inspect
-- Read a fair lock for an inspection (see inspect.lua for the reply): its
-- holders, and its queue in order with when each place ends.
--
-- KEYS[1]  lock name
-- KEYS[2]  queue of waiter fields
-- KEYS[3]  zset of waiter field -> place deadline
-- KEYS[4]  fences of lost replies
local holders, wrong = holders_of(KEYS[1])
if wrong then
    return wrong
end
local line = {}
if redis.call('type', KEYS[2])['ok'] == 'list' then
    for _, waiter in ipairs(redis.call('lrange', KEYS[2], 0, -1)) do
        local deadline = raised(redis.pcall('zscore', KEYS[3], waiter))
        line[#line + 1] = waiter
        if type(deadline) == 'string' then
            line[#line + 1] = tonumber(deadline)
        else
            line[#line + 1] = 0
        end
    end
end
return {clock_ms(), existing(KEYS), holders, line}
