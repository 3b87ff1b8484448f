-- Take, or take again, a reentrant lock (see holds.lua for the layout).
--
-- KEYS[1]  lock name
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner field
--
-- Reply: nil when the caller holds the lock after this call; otherwise the
-- lock's remaining time to live in milliseconds (-1 when it has no expiry),
-- which bounds how long a waiter may sleep before trying again.
local name, lease, owner = KEYS[1], ARGV[1], ARGV[2]

-- A free lock or a re-entry by its owner both end in one more hold.
-- HEXISTS raises WRONGTYPE on a key of another type, leaving it untouched.
local free = redis.call('exists', name) == 0
if free or redis.call('hexists', name, owner) == 1 then
    take_hold(name, owner, lease)
    return nil
end

return redis.call('pttl', name)
