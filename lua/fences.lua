-- Shared head of every script that changes a primitive (prepended by
-- src/lua.rs, before the primitive's own head).
--
-- Exactly-once effects (the argument is in src/engine/ledger.rs). Every call that
-- changes a lock carries, after its own arguments, a request id and then the
-- ids of the same owner's earlier calls whose replies never came. Ids are
-- numbers counted per client, so `<owner>:<id>` names a call uniquely. The
-- lost ones are fenced: kept in the set `fences` for FENCE_MEMORY ms, and a
-- call found there does nothing, however late it arrives.
--
-- `fenced` is the first thing such a script does, before any write, and
-- returns the reply that ends the call there: stale() for a fenced call, a
-- refusal when this user may not set an expiry on a key the call may create
-- with one (refused_expiry: the keys `expiring` names, an acquisition's; the
-- fences' own when it records lost ids), or false when the call goes on.
local FENCE_MEMORY = 900000

-- The reply of a fenced call; nobody waits for it (its caller has moved on).
local function stale()
    return redis.error_reply('STALE a request of this owner that was fenced after its reply was lost')
end

-- Redis checks a script's commands one by one as it runs them, and keeps
-- what the script wrote before a refused one: a PEXPIRE refused after a write
-- (a permission taken away while the client runs) would leave a key with no
-- TTL, held for ever. So whether this user may set an expiry on each of the
-- call's keys is asked before the first write (redis.acl_check_cmd: Redis 7,
-- Valkey; Redis 6 cannot be asked). The refusal names the command and the
-- key, as the client's first call's permission question does.
local function refused_expiry(keys)
    if redis.acl_check_cmd == nil then
        return nil
    end
    for _, key in ipairs(keys) do
        if not redis.acl_check_cmd('pexpire', key, '0') then
            return redis.error_reply('NOPERM this user may not run the pexpire command on key ' .. key)
        end
    end
    return nil
end

-- Only the keys a call may create with an expiry are asked about: a release,
-- a leave or a renewal creates none (a key it writes has its TTL already,
-- which HSET and HINCRBY keep), a semaphore's keys have no expiry, and asking
-- costs the server: about 7 300 instructions per lock+unlock for the lock's
-- one key, 2 000 to 3 000 for each more (BENCHMARKS.md).
local function fenced(fences, own_args, owner, expiring)
    if expiring then
        local refusal = refused_expiry(expiring)
        if refusal then
            return refusal
        end
    end
    if redis.call('sismember', fences, owner .. ':' .. ARGV[own_args + 1]) == 1 then
        return stale()
    end
    if #ARGV > own_args + 1 then
        local refusal = refused_expiry({fences})
        if refusal then
            return refusal
        end
        local lost = {}
        for i = own_args + 2, #ARGV do
            lost[#lost + 1] = owner .. ':' .. ARGV[i]
        end
        redis.call('sadd', fences, unpack(lost))
        redis.call('pexpire', fences, FENCE_MEMORY)
    end
    return false
end
