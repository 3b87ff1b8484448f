-- Delete one Redlock node's key, but only if it still carries this
-- acquisition's token: a key that expired and was taken by someone else must
-- survive our late release.
--
-- KEYS[1]  the lock name
-- ARGV[1]  the token written by our SET NX PX
--
-- Reply: 1 = deleted, 0 = no such key, -1 = the key carries another token.
local current = redis.call('get', KEYS[1])
if current == ARGV[1] then
    redis.call('del', KEYS[1])
    return 1
end
if current then
    return -1
end
return 0
