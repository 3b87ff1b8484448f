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
