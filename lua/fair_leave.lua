-- A waiter gives up its place in a fair lock's queue (see fair_queue.lua for
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
if fenced(KEYS[4], 3, owner) then
    return stale()
end

local head = purge(queue, timeouts, server_now())
redis.call('zrem', timeouts, owner)
local removed = redis.call('lrem', queue, 0, owner)
if head == owner then
    notify_head(name, queue, channel, message)
end
return math.min(removed, 1)
