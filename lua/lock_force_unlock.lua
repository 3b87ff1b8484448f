-- Delete a reentrant lock whoever holds it (see delete_lock.lua), and wake its
-- waiters.
--
-- KEYS[1]  lock name
-- KEYS[2]  unlock channel
-- ARGV[1]  unlock message
--
-- Reply: 1 when a lock was deleted, 0 when there was none. A key of another
-- type is left alone and reported as WRONGTYPE.
local deleted = delete_lock(KEYS[1])
if deleted == 1 then
    redis.call(PUBLISH, KEYS[2], ARGV[1])
end
return deleted
