-- The reentrant lock: Redisson's RLock, a hash of holds at the lock's name
-- (see holds.lua for the layout). Each script of the primitive is a section
-- below, from its "--- script:" line to the next, composed after holds.lua
-- (the renewal and the inspection without it) by src/lock/reentrant.rs: Redis makes
-- every function a script's text defines on every call, so each script
-- carries only its own section.

--- script: acquire
-- Take, or take again, a reentrant lock (see holds.lua for the layout).
--
-- KEYS[1]  lock name
-- KEYS[2]  fences of lost replies
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner field
-- ARGV[3]  the owner's holds by its client's count
-- ARGV[4]  request id, then the ids to fence
--
-- Reply: nil when the caller holds the lock after this call (-3 when that is a
-- first hold although its client counted more); otherwise the lock's remaining
-- time to live in milliseconds (-1 when it has no expiry), which bounds how
-- long a waiter may sleep before trying again.
local halted = fenced(KEYS[2], 3, ARGV[2], {KEYS[1]})
if halted then
    return halted
end
return take_hold(KEYS[1], ARGV[2], tonumber(ARGV[3]), ARGV[1])

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
-- waiters retry at once.
--
-- KEYS[1]  lock name
-- KEYS[2]  unlock channel ("redisson_lock__channel:{name}")
-- KEYS[3]  fences of lost replies
-- ARGV[1]  unlock message; empty for a lock whose waiters do not listen (spin)
-- ARGV[2]  lease in milliseconds, applied again while holds remain (0: kept)
-- ARGV[3]  owner field
-- ARGV[4]  holds the owner keeps
-- ARGV[5]  request id, then the ids to fence
--
-- Reply: nil when the owner holds nothing, 0 when holds remain, 1 when the
-- lock was released.
local halted = fenced(KEYS[3], 4, ARGV[3])
if halted then
    return halted
end
local released = give_back_holds(KEYS[1], ARGV[3], tonumber(ARGV[4]), ARGV[2])
if released == 1 and ARGV[1] ~= '' then
    redis.call(PUBLISH, KEYS[2], ARGV[1])
end
return released

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
local token = ''
if KEYS[3] then
    token = counter_of(KEYS[3])
end
local holders, wrong = holders_of(KEYS[1], token)
if wrong then
    return wrong
end
local reply = {clock_ms(), existing(KEYS), holders, {}}
if KEYS[3] then
    reply[5] = token
end
return reply
