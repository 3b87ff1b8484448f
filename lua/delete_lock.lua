-- Deleting a lock whoever holds it, for the force-unlock scripts (prepended
-- by src/lua.rs after holds.lua). Kept out of holds.lua: every function a
-- script's text defines is made again on every call, and the lock's hot paths
-- (acquire, release) never delete by force.

-- Whether the hash at `name` has the layout of a lock: a few fields, each an
-- owner ("<client uuid>:<owner id>") with a whole, positive hold count. A
-- user's own hash under the same name is not one, and must never be deleted.
local function is_lock(name)
    local OWNER = '^' .. string.rep('%x', 8) .. '%-' .. string.rep('%x', 4) .. '%-'
        .. string.rep('%x', 4) .. '%-' .. string.rep('%x', 4) .. '%-'
        .. string.rep('%x', 12) .. ':%w+$'
    if redis.call('hlen', name) > 64 then
        return false
    end
    local fields = redis.call('hgetall', name)
    for i = 1, #fields, 2 do
        if not string.find(fields[i], OWNER) or not string.find(fields[i + 1], '^[1-9]%d*$') then
            return false
        end
    end
    return true
end

-- Tells each holder of the hash `name` that its hold is being taken by force:
-- fredlock's client listens on "fredlock_client:<client uuid>" (classic pub/sub,
-- on a sharded cluster too: the channel is in no lock's slot) and looks at its
-- holds at once instead of at its next renewal. Redisson's clients hear nothing.
local function tell_holders(name)
    local fields = redis.call('hkeys', name)
    for _, field in ipairs(fields) do
        local client = string.match(field, '^(%x+%-%x+%-%x+%-%x+%-%x+):')
        if client then
            redis.call('publish', 'fredlock_client:' .. client, name)
        end
    end
end

-- Deletes the lock whoever holds it, telling its holders: 1 when it was
-- deleted, 0 when there was none, and a WRONGTYPE error reply, leaving it
-- alone, for a key that is not a lock (another type, or a hash without the lock
-- layout).
local function delete_lock(name)
    local kind = redis.call('type', name).ok
    if kind == 'none' then
        return 0
    end
    if kind ~= 'hash' or not is_lock(name) then
        return redis.error_reply('WRONGTYPE the key is not a lock: only a hash of owner fields and hold counts is one')
    end
    tell_holders(name)
    redis.call('del', name)
    return 1
end
