-- Give back one hold of a fair lock (see fair_queue.lua for the keys); the
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

if redis.call('hexists', name, owner) == 0 then
    -- The lock may have expired without a word to anyone: wake the first
    -- waiter in case it is free.
    notify_head(name, queue, channel, message)
    return nil
end

if redis.call('hincrby', name, owner, -1) > 0 then
    redis.call('pexpire', name, lease)
    return 0
end

redis.call('del', name)
notify_head(name, queue, channel, message)
return 1
