-- Job lock: a scheduled job runs on one instance at a time, in ShedLock's
-- Redis layout (see ../shared/DESIGN.md, section 4b), so that a Spring service
-- and a Rust service share a job. Composed by src/job/mod.rs.
--
--   <prefix>:<env>:<name>              string "ADDED:<ISO-8601 time>@<host>:<id>",
--                                      a new one per acquisition; its TTL is
--                                      lockAtMostFor, then lockAtLeastFor's rest
--   fredlock_job__channel:{<key>}      0 when a run gives the job back: wakes
--                                      the instances that wait for it
--   fredlock_job_tick:{<key>}          fredlock's own: the latest scheduled tick
--                                      any instance started (ms since the Unix
--                                      epoch), kept for a set time
--
-- A run's single attempt is ShedLock's `SET NX PX` (with GET), sent as a
-- plain command (src/job/kind.rs); these scripts do the rest. Every attempt
-- replies in the engine's shape (src/engine/kind.rs, Reply). Every change compares the value first: a key that
-- is not ours (another node's, after ours expired) is never touched, the bug
-- of ShedLock's unsafe delete (#2583).

-- The value at `key`, false when there is none, or an error reply naming the
-- key when it is not a string (a user's own data under the job's name).
local function job_value(key)
    local value = raised(redis.pcall('get', key))
    if type(value) == 'table' and value['err'] then
        return nil, redis.error_reply('WRONGTYPE not a job lock (a string): ' .. key)
    end
    return value
end

-- How long a waiting instance sleeps at most before it looks at `key` again:
-- its TTL, bounded by `bound` ms, so that a ShedLock node's release, which
-- publishes nothing, costs a bounded poll (and a key without expiry, too).
local function sleep_ms(key, bound)
    local pttl = redis.call('pttl', key)
    if pttl < 0 or pttl > bound then
        return bound
    end
    return pttl
end

--- script: release
-- Ends a run: keeps the key until the at-least-for deadline if that is still
-- ahead, else deletes it and wakes the waiting instances.
--
-- KEYS[1]  job key
-- KEYS[2]  channel of the waiting instances
-- ARGV[1]  the run's value
-- ARGV[2]  ms left until the at-least-for deadline (0: none left)
--
-- Reply: 1 when the value was ours (kept or deleted), nil otherwise.
local value, problem = job_value(KEYS[1])
if problem then
    return problem
end
if value ~= ARGV[1] then
    return nil
end
local keep = tonumber(ARGV[2])
if keep > 0 then
    redis.call('pexpire', KEYS[1], keep)
    return 1
end
redis.call('del', KEYS[1])
redis.call(PUBLISH, KEYS[2], 0)
return 1

--- script: renew
-- The watchdog's batch: keeps alive (or with a lease of 0 only checks) each
-- run whose value is still at its key. An expiry is only ever lengthened, so
-- that at-most-for still bounds a run the keep-alive gave up on.
--
-- KEYS     job keys
-- ARGV[1]  lease in ms (0: check only)
-- ARGV[2..] each key's value
--
-- Reply: one integer per key, 1 when the value is there.
local lease = tonumber(ARGV[1])
local replies = {}
for i, key in ipairs(KEYS) do
    local value = raised(redis.pcall('get', key))
    if value == ARGV[i + 1] then
        if lease > 0 and redis.call('pttl', key) < lease then
            redis.call('pexpire', key, lease)
        end
        replies[i] = 1
    else
        replies[i] = 0
    end
end
return replies

--- script: acquire
-- Takes the job for an instance that waits for it, in the engine's reply
-- shape: nil when taken (or ours already: a resend), else how long to sleep at
-- most before trying again (see sleep_ms).
--
-- KEYS[1]  job key
-- ARGV[1]  the run's value
-- ARGV[2]  at-most-for in ms
-- ARGV[3]  the longest sleep in ms
local value, problem = job_value(KEYS[1])
if problem then
    return problem
end
if not value then
    redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return nil
end
if value == ARGV[1] then
    -- A resend: its client counts at-most-for from this send, so it starts
    -- again now (as the permit semaphore's found grant does: tests/model.rs).
    redis.call('pexpire', KEYS[1], ARGV[2])
    return nil
end
return sleep_ms(KEYS[1], tonumber(ARGV[3]))

--- script: tick
-- Takes the job for one scheduled tick: only if no instance started that tick
-- or a later one, and nobody runs the job now. The tick is recorded with the
-- acquisition, so a fast run does not let a late instance run it again.
--
-- KEYS[1]  job key
-- KEYS[2]  last tick
-- ARGV[1]  the run's value
-- ARGV[2]  at-most-for in ms
-- ARGV[3]  the tick (ms since the Unix epoch)
-- ARGV[4]  how long the last tick is kept, in ms
-- ARGV[5]  the longest sleep in ms
--
-- Reply, in the engine's shape: nil when taken (or ours already: a resend,
-- whose tick is recorded); the last tick, a string, when that tick or a later
-- one was started (refused: waiting would not change it); else, while another
-- run holds the job, how long to sleep at most before trying again (see
-- sleep_ms).
local value, problem = job_value(KEYS[1])
if problem then
    return problem
end
if value == ARGV[1] then
    -- As the acquire script's resend.
    redis.call('pexpire', KEYS[1], ARGV[2])
    return nil
end
local last = raised(redis.pcall('get', KEYS[2]))
if type(last) == 'table' and last['err'] then
    return redis.error_reply('WRONGTYPE not a job lock tick (a string): ' .. KEYS[2])
end
last = tonumber(last or '')
if last and last >= tonumber(ARGV[3]) then
    return tostring(last)
end
if value then
    return sleep_ms(KEYS[1], tonumber(ARGV[5]))
end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('set', KEYS[2], ARGV[3], 'PX', ARGV[4])
return nil

--- script: force_unlock
-- Ends the current run whoever runs it: deletes the key, tells a fredlock
-- holder (whose value ends with "<client uuid>:<n>") on its client's channel,
-- and wakes the waiting instances. The last tick stays.
--
-- KEYS[1]  job key
-- KEYS[2]  channel of the waiting instances
--
-- Reply: 1 when it was held, 0 when not.
local value, problem = job_value(KEYS[1])
if problem then
    return problem
end
if not value then
    return 0
end
local client = string.match(value, ':(%x+%-%x+%-%x+%-%x+%-%x+):%d+$')
if client then
    redis.call('publish', 'fredlock_client:' .. client, KEYS[1])
end
redis.call('del', KEYS[1])
redis.call(PUBLISH, KEYS[2], 0)
return 1

--- script: inspect
-- KEYS[1]  job key
-- KEYS[2]  last tick
--
-- Reply: the inspect head, the holder's owner field being the key's value
-- (whose host JobHolder reads); its tail the last tick, or ''.
local value, problem = job_value(KEYS[1])
if problem then
    return problem
end
local holders = {}
if value then
    holders = {value, 1, ''}
end
local last = raised(redis.pcall('get', KEYS[2]))
if type(last) ~= 'string' then
    last = ''
end
return {clock_ms(), existing({KEYS[1], KEYS[2]}), holders, {}, last}
