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
local now = server_now()
local head, expired, wrong = read_line(queue, timeouts, now)
if wrong then
    return wrong
end
if fenced(KEYS[4], 3, owner) then
    return stale()
end

head = purge(queue, timeouts, now, head, expired)
redis.call('zrem', timeouts, owner)
local removed = redis.call('lrem', queue, 0, owner)
if head == owner and redis.call('exists', name) == 0 then
    notify_head(channel, message, redis.call('lindex', queue, 0))
end
return math.min(removed, 1)
