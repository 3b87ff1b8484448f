-- Delete a fair lock whoever holds it, and tell its first waiter (see
-- delete_lock.lua and fair_queue.lua). The queue itself is kept: its waiters still
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
