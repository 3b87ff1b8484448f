-- Give back one hold of a reentrant lock; the last hold deletes the lock and
-- announces it on the lock's channel so that waiters retry at once.
--
-- KEYS[1]  lock name
-- KEYS[2]  unlock channel ("redisson_lock__channel:{name}")
-- ARGV[1]  unlock message
-- ARGV[2]  lease in milliseconds, applied again while holds remain
-- ARGV[3]  owner field
--
-- Reply: nil when the owner holds nothing (never held, expired or deleted),
-- 0 when holds remain, 1 when the lock was released.
local name, channel = KEYS[1], KEYS[2]
local message, lease, owner = ARGV[1], ARGV[2], ARGV[3]

if redis.call('hexists', name, owner) == 0 then
    return nil
end

if redis.call('hincrby', name, owner, -1) > 0 then
    redis.call('pexpire', name, lease)
    return 0
end

redis.call('del', name)
redis.call('publish', channel, message)
return 1
