-- Shared head of every fair-lock script (prepended to each by src/scripts.rs).
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
-- named in an error reply (whose form src/error.rs reads) with nothing changed.
local function read_line(queue, timeouts, now)
    local head = redis.pcall('lindex', queue, 0)
    if type(head) == 'table' and head.err then
        return nil, nil, redis.error_reply('WRONGTYPE not the queue of a fair lock (a list): ' .. queue)
    end
    local expired = redis.pcall('zrangebyscore', timeouts, '-inf', now)
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
