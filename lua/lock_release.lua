-- Give back holds of a reentrant lock (see holds.lua); when none remain the
-- lock is deleted and its release announced on the lock's channel, so that
-- waiters retry at once.
--
-- KEYS[1]  lock name
-- KEYS[2]  unlock channel ("redisson_lock__channel:{name}")
-- KEYS[3]  fences of lost replies
-- ARGV[1]  unlock message; empty for a lock whose waiters do not listen (spin)
-- ARGV[2]  lease in milliseconds, applied again while holds remain (0: kept)
-- ARGV[3]  owner field
-- ARGV[4]  holds the owner keeps
-- ARGV[5]  request id, then the ids to fence
--
-- Reply: nil when the owner holds nothing, 0 when holds remain, 1 when the
-- lock was released.
if fenced(KEYS[3], 4, ARGV[3]) then
    return stale()
end
local released = give_back_holds(KEYS[1], ARGV[3], tonumber(ARGV[4]), ARGV[2])
if released == 1 and ARGV[1] ~= '' then
    redis.call(PUBLISH, KEYS[2], ARGV[1])
end
return released
