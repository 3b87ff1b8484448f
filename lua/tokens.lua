-- Shared head of the scripts that issue fencing tokens (prepended by
-- src/lua.rs, after holds.lua): a fenced lock's tokens and a leader
-- election's epochs. The counter is a string without expiry that every first
-- hold increments.
--
-- A missing counter (never used, or lost: a restart without persistence, an
-- eviction, a DEL) is seeded from the server clock in microseconds before it is
-- incremented, so a token issued after the loss exceeds every earlier one as
-- long as that clock never steps back and fewer than a million tokens were
-- issued per second since the counter was first seeded.

-- TIME makes a token script non-deterministic: replicate its effects (Redis
-- < 5 needs asking; Redis 7 always does it).
redis.replicate_commands()

-- An error reply naming `counter` as the `what` when it holds anything but a
-- whole number; nil when it is missing or one. Checked before anything is
-- written: INCR would fail half way.
local function bad_counter(counter, what)
    local current = raised(redis.pcall('get', counter))
    if type(current) == 'table' or (current and not string.find(current, '^%d+$')) then
        return redis.error_reply('WRONGTYPE not the ' .. what .. ' (a string holding a whole number): ' .. counter)
    end
    return nil
end

-- The next token of `counter`, seeding it from the server clock when missing.
local function next_token(counter)
    if redis.call('exists', counter) == 0 then
        local now = redis.call('time')
        redis.call('set', counter, now[1] .. string.format('%06d', tonumber(now[2])))
    end
    return redis.call('incr', counter)
end

-- Take, or take again, a hold (see take_hold in holds.lua) whose first hold
-- issues a token from `counter` (a `what`, named by the error when it holds
-- anything else). Replies as a token script does: {token, afresh} for a first
-- hold (afresh 1 when its client counted holds that were gone), nil for a
-- re-entry its client counts, otherwise the PTTL; the second value is true for
-- a first hold.
local function take_with_token(name, owner, holds, lease, counter, what)
    local wrong = bad_counter(counter, what)
    if wrong then
        return wrong, false
    end
    local taken = take_hold(name, owner, holds, lease)
    if taken ~= nil and taken ~= -3 then
        return taken, false
    end
    if taken == nil and holds > 0 then
        return nil, false
    end
    local afresh = 0
    if taken == -3 then
        afresh = 1
    end
    return {next_token(counter), afresh}, true
end
