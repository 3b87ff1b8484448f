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

-- Deletes the lock whoever holds it: 1 when it was deleted, 0 when there was
-- none, and a WRONGTYPE error reply, leaving it alone, for a key of another type.
local function delete_lock(name)
    local kind = redis.call('type', name).ok
    if kind == 'none' then
        return 0
    end
    if kind ~= 'hash' then
        return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
    end
    redis.call('del', name)
    return 1
end

