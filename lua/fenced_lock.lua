-- The fenced lock: Redisson's RFencedLock, the reentrant lock (lock.lua) with
-- its own acquire, composed after holds.lua and tokens.lua by src/lock/fenced.rs; its other
-- scripts are the reentrant lock's.

--- script: acquire
-- Take, or take again, a fenced lock: Redisson's RFencedLock, the reentrant
-- lock (see holds.lua) plus a counter of fencing tokens, a string without
-- expiry that every first hold increments.
--
-- KEYS[1]  lock name
-- KEYS[2]  fences of lost replies
-- KEYS[3]  token counter ("redisson_lock_token:{name}")
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner field
-- ARGV[3]  the owner's holds by its client's count
-- ARGV[4]  request id, then the ids to fence
--
-- Reply: {token, afresh} for a first hold (afresh 1 when its client counted
-- holds that were gone); nil for a re-entry its client counts, which keeps the
-- token of its first hold; otherwise the lock's remaining time to live in ms
-- (-1 when it has no expiry), as the reentrant lock's acquire (lock.lua).
--
-- Tokens come from tokens.lua: never backwards, even after the counter is lost.

local halted = fenced(KEYS[2], 3, ARGV[2], {KEYS[1]})
if halted then
    return halted
end

return take_with_token(KEYS[1], ARGV[2], tonumber(ARGV[3]), ARGV[1], KEYS[3],
    'fencing token counter of a fenced lock')
