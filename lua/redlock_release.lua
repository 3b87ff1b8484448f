-- Delete one Redlock node's key if it carries this acquisition's token.
--
-- KEYS[1]  the lock name
-- ARGV[1]  the token written by our SET NX PX
--
-- Reply: token_state before the call (1 = deleted).
local state = token_state(KEYS[1], ARGV[1])
if state == 1 then
    redis.call('del', KEYS[1])
end
return state
