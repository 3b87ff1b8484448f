-- Give back one hold of a reentrant lock (see holds.lua); the last hold
-- deletes the lock and announces it on the lock's channel so that waiters
-- retry at once.
--
-- KEYS[1]  lock name
-- KEYS[2]  unlock channel ("redisson_lock__channel:{name}")
-- ARGV[1]  unlock message
-- ARGV[2]  lease in milliseconds, applied again while holds remain
-- ARGV[3]  owner field
--
-- Reply: nil when the owner holds nothing, 0 when holds remain, 1 when the
-- lock was released.
local released = give_back_hold(KEYS[1], ARGV[3], ARGV[2])
if released == 1 then
    redis.call('publish', KEYS[2], ARGV[1])
end
return released
