-- The reentrant lock: Redisson's RLock, a hash of holds at the lock's name
-- (see holds.lua for the layout). Each script of the primitive is a section
-- below, from its "--- script:" line to the next, composed after holds.lua
-- (the renewal and the inspection without it) by src/lock/reentrant.rs: Redis makes
-- every function a script's text defines on every call, so each script
-- carries only its own section.
--
-- The line (fredlock's own, beside Redisson's layout): a zset at
-- "fredlock_lock_waiters:{name}" of the clients with a task waiting for the
-- lock, each by its number, scored by when its place ends (ms). A release
-- publishes the first live one's number on the lock's channel just before its
-- unlock message, and only that client wakes a waiter: every other fredlock
-- client lets that unlock message pass. Redisson's clients ignore numbers
-- other than 0 and 1 and wake on the message as before; a release of theirs
-- comes without a number and wakes every client. The line binds nobody for
-- long: for HAND_OVER ms after a release named a client, the lock is kept
-- for it ("fredlock_lock_next:{name}", the number, with that TTL) from every
-- other fredlock client that stands in line, so that the releasing client's
-- next attempt, one round trip ahead of the woken one, does not take the lock
-- again and again while the named client waits. Redisson's clients, an
-- attempt that does not wait, and a first attempt of a client that knows of no
-- contention (src/engine/line.rs) never look: they take a free lock as before.
-- A release that named a client replies 2, so that the releasing client's
-- next attempt looks.

-- How long a lock is kept for the client a release named (ms): the woken
-- client's round trip and its wake-up, with room for a loaded machine. A named
-- client that no longer waits ends the keeping as it passes the wake on
-- (pass_on); one that crashed costs the others a third of their places.
local HAND_OVER = 50

--- script: acquire
-- Take, or take again, a reentrant lock (see holds.lua for the layout).
--
-- KEYS[1]  lock name
-- KEYS[2]  fences of lost replies
-- KEYS[3]  (a lock whose waiters stand in line) the line, see above
-- KEYS[4]  (with KEYS[3]) the client a release named, see above
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner field
-- ARGV[3]  the owner's holds by its client's count
-- With KEYS[3], then:
-- ARGV[4]  the client's number in the line
-- ARGV[5]  how long its place lasts without another attempt (ms)
-- ARGV[6]  what a win does to its place: 'keep' (another task of the client
--          waits on), 'leave', or 'none' (the first attempt, which did not
--          stand in line)
-- Last     request id, then the ids to fence
--
-- Reply: nil when the caller holds the lock after this call (-3 when that is a
-- first hold although its client counted more); otherwise the lock's remaining
-- time to live in milliseconds (-1 when it has no expiry), which bounds how
-- long a waiter may sleep before trying again (for a lock kept for a named
-- client, a place: the waiter sleeps until it is named, or a third of its
-- place). A busy reply puts the client in line, or keeps it there.
local line = KEYS[3]
local own_args = 3
if line then
    own_args = 6
end
local halted = fenced(KEYS[2], own_args, ARGV[2], {KEYS[1]})
if halted then
    return halted
end
-- A lock kept for another named client is busy for this one, unless it holds
-- it already (a re-entry); the named client ends the keeping when it comes.
local kept = nil
if line then
    local named = raised(redis.pcall('get', KEYS[4]))
    if named == ARGV[4] then
        redis.call('del', KEYS[4])
    elseif type(named) == 'string' and redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
        kept = tonumber(ARGV[5])
    end
end
-- A win leaves the line before it writes the hold, so that nothing refused
-- after that write can fail a call whose hold is in Redis. The line's calls
-- are protected: a key of another type there is no line, and no reason to
-- refuse the lock.
if line and not kept and ARGV[6] == 'leave' and (redis.call('exists', KEYS[1]) == 0
        or redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
    raised(redis.pcall('zrem', line, ARGV[4]))
end
local reply = kept or take_hold(KEYS[1], ARGV[2], tonumber(ARGV[3]), ARGV[1])
if line and reply ~= nil and reply ~= -3 then
    -- In line until its place ends. A place is made to last again only once a
    -- third of it has passed, so that a client keeps its turn (the zset orders
    -- by when places end) through the attempts it makes while it waits; its
    -- waiters try at least every third of a place.
    local time = redis.call('time')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local place = tonumber(ARGV[5])
    local ends = raised(redis.pcall('zscore', line, ARGV[4]))
    if type(ends) == 'table' then
        -- Of another type: no line to stand in.
        return reply
    end
    if not ends or tonumber(ends) - now < place * 2 / 3 then
        -- Asked here, not with the hold's key: a busy reply has written nothing
        -- yet, and an acquisition that wins pays nothing for it.
        local refusal = refused_expiry({line})
        if refusal then
            return refusal
        end
        -- The places that ended go first: removing them all may delete the key,
        -- whose TTL is read after.
        redis.call('zremrangebyscore', line, '-inf', now)
        local ttl = redis.call('pttl', line)
        redis.call('zadd', line, now + place, ARGV[4])
        if ttl < place then
            redis.call('pexpire', line, place)
        end
    end
end
return reply

--- script: refuse_reentry
-- A non-reentrant lock's attempt by an owner that holds it already, found in
-- the owner's turn (two attempts of one task on their way at once): refused
-- with the engine's DEADLOCK code, changing nothing.
--
-- KEYS[1]  lock name (routes the call to the lock's node)
-- ARGV[1]  why, for people
return redis.error_reply('DEADLOCK ' .. ARGV[1])

--- script: release
-- Give back holds of a reentrant lock (see holds.lua); when none remain the
-- lock is deleted and its release announced on the lock's channel, so that
-- waiters retry at once: the first client in line named first, if there is
-- one.
--
-- KEYS[1]  lock name
-- KEYS[2]  unlock channel ("redisson_lock__channel:{name}")
-- KEYS[3]  fences of lost replies
-- KEYS[4]  (a lock whose waiters stand in line) the line
-- KEYS[5]  (with KEYS[4]) the client a release named
-- ARGV[1]  unlock message; empty for a lock whose waiters do not listen (spin)
-- ARGV[2]  lease in milliseconds, applied again while holds remain (0: kept)
-- ARGV[3]  owner field
-- ARGV[4]  holds the owner keeps
-- ARGV[5]  request id, then the ids to fence
--
-- Reply: nil when the owner holds nothing, 0 when holds remain, 1 when the
-- lock was released, 2 when it was released and the first client in line
-- named (its client remembers the hand-over a moment, see src/engine/line.rs).
local halted = fenced(KEYS[3], 4, ARGV[3])
if halted then
    return halted
end
-- The first live place in line (the smallest end not yet passed), read
-- before anything is written: a read refused after the release would fail a
-- call whose lock is gone. Protected: a key of another type there names
-- nobody.
local first = nil
if ARGV[1] ~= '' and KEYS[4] and redis.call('exists', KEYS[4]) == 1 then
    local time = redis.call('time')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local found = raised(redis.pcall('zrangebyscore', KEYS[4], now, '+inf', 'LIMIT', 0, 1))
    if found.err == nil then
        first = found[1]
    end
end
local released = give_back_holds(KEYS[1], ARGV[3], tonumber(ARGV[4]), ARGV[2])
if released == 1 and ARGV[1] ~= '' then
    if first then
        -- Kept for it a moment. Protected, and its failure let pass: without
        -- the keeping the named client is woken all the same.
        redis.pcall('set', KEYS[5], first, 'PX', HAND_OVER)
        redis.call(PUBLISH, KEYS[2], first)
        released = 2
    end
    redis.call(PUBLISH, KEYS[2], ARGV[1])
end
return released

--- script: pass_on
-- What a client a release named does when none of its tasks waits any more
-- (a wait given up while its place lasted): it ends the keeping, if the lock
-- is still kept for it, and wakes every waiting client, as a release without
-- a number does.
--
-- KEYS[1]  unlock channel
-- KEYS[2]  the client a release named
-- ARGV[1]  unlock message
-- ARGV[2]  the client's number in line
if redis.call('get', KEYS[2]) == ARGV[2] then
    redis.call('del', KEYS[2])
end
redis.call(PUBLISH, KEYS[1], ARGV[1])
return 1

--- script: renew
-- Extend many watchdog-held locks in one call. A lock is extended only while
-- its owner's field is still there, so a renewal can never bring back a lock
-- that was released, expired or deleted.
--
-- KEYS[i]    lock names (all in one cluster slot)
-- ARGV[1]    lease in milliseconds; 0 only checks that each owner still holds
--            its lock (holds with a fixed lease, which are never extended)
-- ARGV[i+1]  owner field for KEYS[i]
--
-- Reply: one integer per key, 1 = extended (or still held), 0 = the owner no
-- longer holds it.
local lease = ARGV[1]
local renewed = {}

for i, name in ipairs(KEYS) do
    -- pcall: a key replaced by another type counts as lost instead of
    -- failing the renewal of every other key in the batch.
    local held = raised(redis.pcall('hexists', name, ARGV[i + 1]))
    if held == 1 then
        if lease ~= '0' then
            redis.call('pexpire', name, lease)
        end
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end

return renewed

--- script: force_unlock
-- Delete a reentrant lock whoever holds it (see delete_lock.lua), and wake its
-- waiters.
--
-- KEYS[1]  lock name
-- KEYS[2]  unlock channel
-- ARGV[1]  unlock message
--
-- Reply: 1 when a lock was deleted, 0 when there was none. A key of another
-- type is left alone and reported as WRONGTYPE.
local deleted = delete_lock(KEYS[1])
if deleted == 1 then
    redis.call(PUBLISH, KEYS[2], ARGV[1])
end
return deleted

--- script: inspect
-- Read a lock of the reentrant family (reentrant, spin, fenced) for an
-- inspection (see inspect.lua for the reply).
--
-- KEYS[1]  lock name
-- KEYS[2]  fences of lost replies
-- KEYS[3]  (fenced lock) the token counter
--
-- Tail: (fenced lock) the last token issued, or ''.
local holders, wrong = holders_of(KEYS[1])
if wrong then
    return wrong
end
local reply = {clock_ms(), existing(KEYS), holders, {}}
if KEYS[3] then
    reply[5] = counter_of(KEYS[3])
end
return reply
