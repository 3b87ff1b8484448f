-- Give one Redlock node's key a fresh TTL, but only if it still carries this
-- acquisition's token: an extension must never revive a key that expired, nor
-- lengthen someone else's.
--
-- KEYS[1]  the lock name
-- ARGV[1]  the token written by our SET NX PX
-- ARGV[2]  the new TTL in milliseconds
--
-- Reply: 1 = extended, 0 = no such key, -1 = the key carries another token.
local current = redis.call('get', KEYS[1])
if current == ARGV[1] then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 1
end
if current then
    return -1
end
return 0
