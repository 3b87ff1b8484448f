-- Shared head of the lock scripts of both kinds (prepended by src/scripts.rs):
-- the rules of Redisson's hash of holds, written once. A lock is a hash whose
-- fields are owners ("<client uuid>:<owner id>") and values their hold counts;
-- its TTL is the lease.

-- One more hold for `owner`, and the lease set again.
local function take_hold(name, owner, lease)
    redis.call('hincrby', name, owner, 1)
    redis.call('pexpire', name, lease)
end

-- One hold fewer for `owner`: nil when it holds none (never held, expired or
-- deleted), 0 when holds remain (the lease is set again), 1 when that was the
-- last one and the lock is gone.
local function give_back_hold(name, owner, lease)
    if redis.call('hexists', name, owner) == 0 then
        return nil
    end
    if redis.call('hincrby', name, owner, -1) > 0 then
        redis.call('pexpire', name, lease)
        return 0
    end
    redis.call('del', name)
    return 1
end

-- Whether the hash at `name` has the layout of a lock: a few fields, each an
-- owner ("<client uuid>:<owner id>") with a whole, positive hold count. A
-- user's own hash under the same name is not one, and must never be deleted.
local OWNER = '^' .. string.rep('%x', 8) .. '%-' .. string.rep('%x', 4) .. '%-'
    .. string.rep('%x', 4) .. '%-' .. string.rep('%x', 4) .. '%-'
    .. string.rep('%x', 12) .. ':%w+$'
local function is_lock(name)
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

-- Deletes the lock whoever holds it: 1 when it was deleted, 0 when there was
-- none, and a WRONGTYPE error reply, leaving it alone, for a key that is not a
-- lock (another type, or a hash without the lock layout).
local function delete_lock(name)
    local kind = redis.call('type', name).ok
    if kind == 'none' then
        return 0
    end
    if kind ~= 'hash' or not is_lock(name) then
        return redis.error_reply('WRONGTYPE the key is not a lock: only a hash of owner fields and hold counts is one')
    end
    redis.call('del', name)
    return 1
end
