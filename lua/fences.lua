-- Shared head of every script that changes a primitive (prepended by
-- src/lua.rs, before the primitive's own head).
--
-- Exactly-once effects (the argument is in src/engine/ledger.rs). Every call that
-- changes a lock carries, after its own arguments, a request id and then the
-- ids of the same owner's earlier calls whose replies never came. Ids are
-- numbers counted per client, so `<owner>:<id>` names a call uniquely. The
-- lost ones are fenced: kept in the set `fences` for FENCE_MEMORY ms, and a
-- call found there does nothing, however late it arrives. Returns true for
-- such a call.
local FENCE_MEMORY = 900000
local function fenced(fences, own_args, owner)
    if redis.call('sismember', fences, owner .. ':' .. ARGV[own_args + 1]) == 1 then
        return true
    end
    if #ARGV > own_args + 1 then
        local lost = {}
        for i = own_args + 2, #ARGV do
            lost[#lost + 1] = owner .. ':' .. ARGV[i]
        end
        redis.call('sadd', fences, unpack(lost))
        redis.call('pexpire', fences, FENCE_MEMORY)
    end
    return false
end

-- The reply of a fenced call; nobody waits for it (its caller has moved on).
local function stale()
    return redis.error_reply('STALE a request of this owner that was fenced after its reply was lost')
end
