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
    local held = redis.pcall('hexists', name, ARGV[i + 1])
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
