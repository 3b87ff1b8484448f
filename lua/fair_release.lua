-- Give back holds of a fair lock (see holds.lua and fair_queue.lua); when none
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
if fenced(KEYS[4], 5, owner) then
    return stale()
end

head = purge(queue, timeouts, now, head, expired)
local released = give_back_holds(name, owner, tonumber(ARGV[5]), lease)
-- Released now, or not held at all: then the lock may have expired without a
-- word to anyone. Either way the first waiter is told if it is free.
if released == 1 or (released == nil and redis.call('exists', name) == 0) then
    notify_head(channel, message, head)
end
return released
