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
if fenced(KEYS[2], 3, ARGV[2]) then
    return stale()
end
return take_hold(KEYS[1], ARGV[2], tonumber(ARGV[3]), ARGV[1])
