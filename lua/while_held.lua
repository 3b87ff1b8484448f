-- Run a caller's script only while an owner still holds a lock of the
-- reentrant family (see LockGuard::eval_while_held in src/lock/guard.rs). The
-- caller's script goes in place of the marker line below, as the body of a
-- function whose KEYS and ARGV are the caller's own: the call's last key is the
-- lock and its last argument the owner field, both taken off before the
-- caller's script sees them.
--
-- Reply: the caller's script's reply, or a NOTHELD error reply, having run
-- nothing, when the owner's field is not in the lock's hash (or the lock's key
-- is no hash at all: then it holds nothing either).
local function while_held(KEYS, ARGV)
--@script
end

local lock, owner = KEYS[#KEYS], ARGV[#ARGV]
if raised(redis.pcall('hexists', lock, owner)) ~= 1 then
    return redis.error_reply('NOTHELD the lock is not held by this owner any more; nothing was run')
end
local keys, args = {}, {}
for i = 1, #KEYS - 1 do
    keys[i] = KEYS[i]
end
for i = 1, #ARGV - 1 do
    args[i] = ARGV[i]
end
return while_held(keys, args)
