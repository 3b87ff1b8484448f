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
if fenced(KEYS[4], 5, owner) then
    return stale()
end

purge(queue, timeouts, server_now())
local released = give_back_holds(name, owner, tonumber(ARGV[5]), lease)
if released ~= 0 then
    -- Released now, or not held at all: then the lock may have expired without
    -- a word to anyone. Either way the first waiter is told if it is free.
    notify_head(name, queue, channel, message)
end
return released
