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

-- An error reply naming the line's key that has the wrong type, or nil; the
-- message's form is read by src/error.rs.
local function wrong_line(queue, timeouts)
    local kind = redis.call('type', queue).ok
    if kind ~= 'none' and kind ~= 'list' then
        return redis.error_reply('WRONGTYPE not the queue of a fair lock (a list): ' .. queue)
    end
    kind = redis.call('type', timeouts).ok
    if kind ~= 'none' and kind ~= 'zset' then
        return redis.error_reply('WRONGTYPE not the place timeouts of a fair lock (a zset): ' .. timeouts)
    end
    return nil
end

-- Milliseconds since the epoch by the server's clock: the one clock every
-- client agrees on.
local function server_now()
    local time = redis.call('time')
    return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- Removes every waiter whose place has expired, wherever it stands in the queue,
-- and any head without a place timeout (which nobody could ever purge otherwise).
-- Returns the first waiter after that, or false.
local function purge(queue, timeouts, now)
    local expired = redis.call('zrangebyscore', timeouts, '-inf', now)
    if #expired > 0 then
        for _, waiter in ipairs(expired) do
            redis.call('lrem', queue, 0, waiter)
        end
        redis.call('zremrangebyscore', timeouts, '-inf', now)
    end
    while true do
        local head = redis.call('lindex', queue, 0)
        if not head or redis.call('zscore', timeouts, head) then
            return head
        end
        redis.call('lpop', queue)
    end
end

-- Tells the first waiter that the lock is free, if it is.
local function notify_head(name, queue, channel, message)
    if redis.call('exists', name) == 1 then
        return
    end
    local head = redis.call('lindex', queue, 0)
    if head then
        redis.call('publish', channel .. ':' .. head, message)
    end
end

-- Every fair-lock script goes on from here, so a line key of the wrong type is
-- named before any of them writes anything.
do
    local wrong = wrong_line(KEYS[2], KEYS[3])
    if wrong then
        return wrong
    end
end
