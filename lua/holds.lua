-- Shared head of the lock scripts of both kinds (prepended by src/lua.rs):
-- the rules of Redisson's hash of holds, written once. A lock is a hash whose
-- fields are owners ("<client uuid>:<owner id>") and values their hold counts;
-- its TTL is the lease.

-- `owner` holds `holds` holds now, and the lease is set again. The count is
-- set, never added to, so that sending the same call twice leaves one effect.
local function set_holds(name, owner, holds, lease)
    redis.call('hset', name, owner, holds)
    redis.call('pexpire', name, lease)
end

-- Gives the lock to `owner`, who may have it (a re-entry, or a lock free for
-- it) and holds `holds` holds by its client's count: one more on a re-entry,
-- else a first hold, replied as -3 when its client counted holds that are
-- gone (nil otherwise).
local function grant_hold(name, owner, holds, lease, reentry)
    if reentry then
        set_holds(name, owner, holds + 1, lease)
        return nil
    end
    set_holds(name, owner, 1, lease)
    if holds > 0 then
        return -3
    end
    return nil
end

-- Take, or take again, the reentrant lock for `owner`: as grant_hold when it
-- may, otherwise the lock's PTTL (-1 without expiry). EXISTS first, so that a
-- free lock (the common case) costs no HEXISTS; on a held one HEXISTS raises
-- WRONGTYPE on a key of another type, before anything is written.
local function take_hold(name, owner, holds, lease)
    if redis.call('exists', name) == 0 then
        return grant_hold(name, owner, holds, lease, false)
    end
    if redis.call('hexists', name, owner) == 1 then
        return grant_hold(name, owner, holds, lease, true)
    end
    return redis.call('pttl', name)
end

-- `owner` keeps `left` holds: nil when it holds none (never held, expired or
-- deleted), 0 when holds remain (the lease set again, unless it is 0), 1 when
-- none remain and the lock is gone. A lock has one owner at a time, so its
-- owner's field is the hash's only one: HDEL of it deletes the lock, and says
-- in the same call whether it was there.
local function give_back_holds(name, owner, left, lease)
    if left == 0 then
        if redis.call('hdel', name, owner) == 0 then
            return nil
        end
        return 1
    end
    if redis.call('hexists', name, owner) == 0 then
        return nil
    end
    redis.call('hset', name, owner, left)
    if lease ~= '0' then
        redis.call('pexpire', name, lease)
    end
    return 0
end
