-- Give back one hold of a fair lock (see holds.lua and fair_queue.lua); the
-- last hold deletes the lock and tells only the first waiter.
--
-- ARGV[1]  channel prefix
-- ARGV[2]  unlock message
-- ARGV[3]  lease in milliseconds, applied again while holds remain
-- ARGV[4]  owner field
--
-- Reply: nil when the owner holds nothing, 0 when holds remain, 1 when the
-- lock was released.
local name, queue, timeouts = KEYS[1], KEYS[2], KEYS[3]
local channel, message, lease, owner = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

purge(queue, timeouts, server_now())
local released = give_back_hold(name, owner, lease)
if released ~= 0 then
    -- Released now, or not held at all: then the lock may have expired without
    -- a word to anyone. Either way the first waiter is told if it is free.
    notify_head(name, queue, channel, message)
end
return released
