-- Delete a lock whoever holds it, and wake its waiters.
--
-- KEYS[1]  lock name
-- KEYS[2]  unlock channel
-- ARGV[1]  unlock message
--
-- Reply: 1 when a lock was deleted, 0 when there was none. A key of another
-- type is left alone and reported as WRONGTYPE.
local name, channel, message = KEYS[1], KEYS[2], ARGV[1]

local kind = redis.call('type', name).ok
if kind == 'none' then
    return 0
end
if kind ~= 'hash' then
    return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end

redis.call('del', name)
redis.call('publish', channel, message)
return 1
