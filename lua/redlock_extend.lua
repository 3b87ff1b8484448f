-- Give one Redlock node's key a fresh TTL if it carries this acquisition's
-- token.
--
-- KEYS[1]  the lock name
-- ARGV[1]  the token written by our SET NX PX
-- ARGV[2]  the new TTL in milliseconds
--
-- Reply: token_state before the call (1 = extended).
local state = token_state(KEYS[1], ARGV[1])
if state == 1 then
    redis.call('pexpire', KEYS[1], ARGV[2])
end
return state
