-- Redlock keys: a string per node holding the token of the acquisition that
-- wrote it. Release and extension must act only on a key that still carries
-- their own token: one that expired and was taken by someone else must survive
-- a late release, and an extension must never revive or lengthen another's.

-- 1 = `key` carries `token`, 0 = no such key, -1 = it carries another token.
local function token_state(key, token)
    local current = redis.call('get', key)
    if current == token then
        return 1
    end
    if current then
        return -1
    end
    return 0
end

-- Each script of a Redlock node is a section below, after this head
-- (src/redlock/nodes.rs composes them).

--- script: release
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

--- script: extend
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
