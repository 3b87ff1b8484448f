-- A read-write lock: Redisson's RReadWriteLock layout, with waiting writers
-- that keep new readers out. This file holds every script of the primitive:
-- the head below goes first (after holds.lua for the scripts that change the
-- lock), then one section, from its "--- script:" line to the next
-- (src/lua.rs composes them; Redis would otherwise make every function of
-- every operation on every call).
--
--   KEYS[1]  lock name: hash with field 'mode' = 'read' | 'write', one field
--            per read holder "<uuid>:<id>" -> hold count, and the writer's
--            "<uuid>:<id>:write" -> hold count
--   KEYS[2]  channel ("redisson_rwlock:{name}"): '0' wakes one waiter, '1'
--            every waiter
--   KEYS[3]  fences of lost replies (see holds.lua)
--   KEYS[4]  fredlock's waiting writers: zset of writer field -> when its
--            place ends, in ms by the server clock (Redisson has none)
--   ARGV[1]  the prefix of read-hold timeout keys: "{name}" (the name itself
--            when it carries a hash tag)
--
-- Each read hold n (1..count) of a reader has its own key
-- "<prefix>:<reader field>:rwlock_timeout:<n>" whose TTL is that hold's
-- lease; the hash lives as long as its longest hold.

redis.replicate_commands()

local name, channel, fences, writers = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix = ARGV[1]
local WRITE_SUFFIX = ':write'
-- How close (ms) a released hold's TTL must come to the hash's for the hash's
-- TTL to be worked out again: a hold and the hash set in one call get the same
-- expiry, and PTTL rounds to the millisecond.
local LONGEST_SLACK = 5

local function now_ms()
    local time = redis.call('time')
    return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

local function timeout_key(field, n)
    return prefix .. ':' .. field .. ':rwlock_timeout:' .. n
end

local function is_reader(field)
    return field ~= 'mode' and string.sub(field, -#WRITE_SUFFIX) ~= WRITE_SUFFIX
end

-- The lock's mode, false when it is free; an error reply for a key that is no
-- read-write lock (another type, or a hash without a mode: a plain lock of the
-- same name), which nothing here may change.
local function read_mode()
    local fields = raised(redis.pcall('hlen', name))
    if fields == 0 then
        return false
    end
    local mode = type(fields) == 'number' and redis.call('hget', name, 'mode')
    if not mode then
        return nil, redis.error_reply('WRONGTYPE not a read-write lock (a hash with a mode field): ' .. name)
    end
    return mode
end

-- The checks every script that changes the lock starts with, before it writes
-- anything: the mode (as read_mode), or an error reply for a key of another
-- kind, for a call fenced after its reply was lost, or for a refused expiry
-- of a key an acquisition may create (`expiring`: see fences.lua, which those
-- scripts include).
local function open(own_args, owner, expiring)
    local mode, wrong = read_mode()
    if wrong then
        return nil, wrong
    end
    local halted = fenced(fences, own_args, owner, expiring)
    if halted then
        return nil, halted
    end
    return mode
end

-- The longest remaining TTL of `field`'s read holds (1..count): -2 when every
-- one has ended.
local function hold_ttl(field, count)
    local longest = -2
    for n = 1, count do
        local ttl = redis.call('pttl', timeout_key(field, n))
        if ttl == -1 or (ttl > longest and longest ~= -1) then
            longest = ttl
        end
    end
    return longest
end

-- Forgets the readers whose holds all ended (their keys expired while the hash
-- lived on), and returns the longest remaining TTL of the read holds left: -2
-- when none are, -1 when one never expires.
local function settle_readers()
    local longest = -2
    local fields = redis.call('hgetall', name)
    for i = 1, #fields, 2 do
        local field, count = fields[i], tonumber(fields[i + 1])
        if is_reader(field) and count then
            local ttl = hold_ttl(field, count)
            if ttl == -2 then
                redis.call('hdel', name, field)
            elseif ttl == -1 or (ttl > longest and longest ~= -1) then
                longest = ttl
            end
        end
    end
    return longest
end

-- When the first live waiting writer's place ends (those whose place ended
-- are removed first), and the server clock then; false when none waits. The
-- clock is read only when the zset exists: most calls find none.
local function waiting_writers()
    if redis.call('exists', writers) == 0 then
        return false
    end
    local now = now_ms()
    redis.call('zremrangebyscore', writers, '-inf', now)
    local first = redis.call('zrange', writers, 0, 0, 'withscores')
    if #first == 0 then
        return false
    end
    return tonumber(first[2]), now
end

-- Sets `field`'s read holds to `count`, each with `lease`, deleting any above.
local function set_read_holds(field, count, before, lease)
    redis.call('hset', name, field, count)
    for n = 1, count do
        redis.call('set', timeout_key(field, n), 1, 'px', lease)
    end
    for n = count + 1, before do
        redis.call('del', timeout_key(field, n))
    end
end

-- Extends the hash to at least `ttl` ms.
local function keep_hash(ttl)
    local current = redis.call('pttl', name)
    if current >= 0 and current < tonumber(ttl) then
        redis.call('pexpire', name, ttl)
    end
end

--- script: read_acquire
-- Take, or take again, a read hold.
--
-- ARGV[2]  lease in ms
-- ARGV[3]  reader field
-- ARGV[4]  the reader's holds by its client's count
-- ARGV[5]  '1' when waiting writers keep new readers out
-- ARGV[6]  request id, then the ids to fence
--
-- Reply: nil (or -3 for a first hold although the client counted more) when
-- held; otherwise how long to sleep at most before trying again, in ms.
local lease, owner, holds = ARGV[2], ARGV[3], tonumber(ARGV[4])
local mode, wrong = open(5, owner, {name, writers})
if wrong then
    return wrong
end
local before = mode and tonumber(redis.call('hget', name, owner)) or 0
local reentry = before > 0 and hold_ttl(owner, before) ~= -2
local may
if mode == 'write' then
    -- Only the writer itself, which keeps its read holds past its write.
    may = redis.call('hexists', name, owner .. WRITE_SUFFIX) == 1
else
    may = true
end
local first_writer, now = false, nil
if may and mode ~= 'write' and not reentry and ARGV[5] == '1' then
    first_writer, now = waiting_writers()
    may = not first_writer
end
if may then
    if not mode then
        redis.call('hset', name, 'mode', 'read', owner, 1)
        redis.call('set', timeout_key(owner, 1), 1, 'px', lease)
        redis.call('pexpire', name, lease)
    else
        set_read_holds(owner, reentry and holds + 1 or 1, before, lease)
        keep_hash(lease)
    end
    if not reentry and holds > 0 then
        return -3
    end
    return nil
end
local ttl = redis.call('pttl', name)
if first_writer then
    -- Kept out by a writer: try again when its place would end at the latest.
    local place = math.max(first_writer - now, 1)
    if ttl < 0 or place < ttl then
        ttl = place
    end
end
return ttl

--- script: write_acquire
-- Take, or take again, the write hold; a reader asking for it is refused.
--
-- ARGV[2]  lease in ms
-- ARGV[3]  writer field ("<reader field>:write")
-- ARGV[4]  the writer's holds by its client's count
-- ARGV[5]  place lifetime in ms: a writer that must wait keeps new readers
--          out until then unless it tries again; 0 keeps nobody out
-- ARGV[6]  request id, then the ids to fence
--
-- Reply: as read_acquire; a DEADLOCK error when the owner holds a read hold
-- (an upgrade would wait for itself).
local lease, owner, holds, place = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local mode, wrong = open(5, owner, {name, writers})
if wrong then
    return wrong
end
if not mode or (mode == 'write' and redis.call('hexists', name, owner) == 1) then
    local reentry = mode ~= false
    redis.call('zrem', writers, owner)
    if reentry then
        redis.call('hset', name, owner, holds + 1)
        keep_hash(lease)
        return nil
    end
    redis.call('hset', name, 'mode', 'write', owner, 1)
    redis.call('pexpire', name, lease)
    if holds > 0 then
        return -3
    end
    return nil
end
local reader = string.sub(owner, 1, -#WRITE_SUFFIX - 1)
local reads = tonumber(redis.call('hget', name, reader))
if mode == 'read' and reads and hold_ttl(reader, reads) ~= -2 then
    return redis.error_reply('DEADLOCK holds a read lock and asked for the write lock, which would wait for itself; release the read holds first')
end
if place > 0 then
    local now = now_ms()
    redis.call('zadd', writers, now + place, owner)
    if redis.call('pttl', writers) < 2 * place then
        redis.call('pexpire', writers, 2 * place)
    end
end
return redis.call('pttl', name)

--- script: read_release
-- Give back read holds: the reader keeps `left`.
--
-- ARGV[2]  lease in ms, set again on the holds left (0: kept)
-- ARGV[3]  reader field
-- ARGV[4]  holds the reader keeps
-- ARGV[5]  request id, then the ids to fence
--
-- Reply: nil when the reader held nothing, 0 when holds remain, 1 when it
-- gave back its last. The lock is deleted, and waiters told, when no hold of
-- anyone remains.
local lease, owner, left = ARGV[2], ARGV[3], tonumber(ARGV[4])
local mode, wrong = open(4, owner)
if wrong then
    return wrong
end
local before = mode and tonumber(redis.call('hget', name, owner))
if not before then
    return nil
end
local mine = hold_ttl(owner, before)
local held = mine ~= -2
if not held then
    left = 0
end
if left > 0 and lease ~= '0' then
    set_read_holds(owner, left, before, lease)
    keep_hash(lease)
elseif left > 0 then
    redis.call('hset', name, owner, left)
    for n = left + 1, before do
        redis.call('del', timeout_key(owner, n))
    end
else
    redis.call('hdel', name, owner)
    for n = 1, before do
        redis.call('del', timeout_key(owner, n))
    end
end
local free = false
if mode == 'write' or (left > 0 and held) then
    -- The write hold, or the reader's own holds left, keep the lock.
elseif redis.call('hlen', name) == 1 then
    free = true
else
    -- The hash lives as long as its longest hold. Only when the holds given
    -- back may have been that one is every reader's TTL read again (and
    -- readers whose holds all ended forgotten): a release by any other reader
    -- costs no pass over them all.
    local ttl = redis.call('pttl', name)
    if mine == -1 or ttl == -1 or mine >= ttl - LONGEST_SLACK then
        local longest = settle_readers()
        if longest == -2 then
            free = true
        elseif longest > 0 then
            redis.call('pexpire', name, longest)
        end
    end
end
if free then
    redis.call('del', name)
    local message = '0'
    if waiting_writers() then
        -- Every waiter: a local reader woken instead of the writer would only
        -- find the writer still waiting.
        message = '1'
    end
    redis.call(PUBLISH, channel, message)
end
if not held then
    return nil
end
if left > 0 then
    return 0
end
return 1

--- script: write_release
-- Give back write holds: the writer keeps `left`.
--
-- ARGV[2]  lease in ms, set again while holds remain (0: kept)
-- ARGV[3]  writer field
-- ARGV[4]  holds the writer keeps
-- ARGV[5]  request id, then the ids to fence
--
-- Reply: as read_release. The last write hold gone, the lock is deleted, or
-- goes to read mode when the writer kept read holds; either way every waiter
-- is told.
local lease, owner, left = ARGV[2], ARGV[3], tonumber(ARGV[4])
local mode, wrong = open(4, owner)
if wrong then
    return wrong
end
if mode ~= 'write' or redis.call('hexists', name, owner) == 0 then
    return nil
end
if left > 0 then
    redis.call('hset', name, owner, left)
    if lease ~= '0' then
        keep_hash(lease)
    end
    return 0
end
redis.call('hdel', name, owner)
local longest = settle_readers()
if longest == -2 then
    redis.call('del', name)
else
    redis.call('hset', name, 'mode', 'read')
    if longest > 0 then
        redis.call('pexpire', name, longest)
    end
end
redis.call(PUBLISH, channel, '1')
return 1

--- script: leave
-- A waiting writer gives up its place; when it was the last, the readers it
-- kept out are told.
--
-- ARGV[2]  writer field
-- ARGV[3]  request id, then the ids to fence
--
-- Reply: 1 when the writer was waiting, 0 when it was not.
local owner = ARGV[2]
local halted = fenced(fences, 2, owner)
if halted then
    return halted
end
local removed = raised(redis.pcall('zrem', writers, owner))
if type(removed) ~= 'number' then
    return redis.error_reply('WRONGTYPE not the waiting writers of a read-write lock (a zset): ' .. writers)
end
if removed == 1 and not waiting_writers() and raised(redis.pcall('hget', name, 'mode')) ~= 'write' then
    redis.call(PUBLISH, channel, '1')
end
return removed

--- script: renew
-- Extend many watchdog-held read and write holds in one call (the same shape
-- as the reentrant lock's renew in lock.lua). A read hold's own timeout keys are extended, never
-- another reader's; the hash is extended, never shortened. Nothing is brought
-- back: a reader whose holds all ended, or a writer whose field is gone,
-- counts as lost.
--
-- KEYS[i]    lock names
-- ARGV[1]    lease in ms; 0 only checks
-- ARGV[i+1]  owner field for KEYS[i] (a writer's ends in ':write')
--
-- Reply: one integer per key, 1 = extended (or still held), 0 = lost.
local lease = ARGV[1]
local renewed = {}
for i, key in ipairs(KEYS) do
    name = key
    if string.find(key, '{', 1, true) then
        prefix = key
    else
        prefix = '{' .. key .. '}'
    end
    local owner = ARGV[i + 1]
    local count = raised(redis.pcall('hget', key, owner))
    count = type(count) == 'string' and tonumber(count)
    local held = false
    if count and not is_reader(owner) then
        held = true
    elseif count then
        held = hold_ttl(owner, count) ~= -2
    end
    if held and lease ~= '0' then
        if is_reader(owner) then
            for n = 1, count do
                redis.call('pexpire', timeout_key(owner, n), lease)
            end
        end
        keep_hash(lease)
    end
    renewed[i] = held and 1 or 0
end
return renewed

--- script: force_unlock
-- Delete the lock whoever holds it, with its read holds' timeout keys, and
-- wake every waiter.
--
-- ARGV[2]  the mode it must be in: 'read', 'write', or '' for either
--
-- Reply: 1 when it was deleted, 0 when there was none (or it was in the other
-- mode). A key that is no read-write lock is left alone: WRONGTYPE.
local mode, wrong = read_mode()
if wrong then
    return wrong
end
if not mode or (ARGV[2] ~= '' and ARGV[2] ~= mode) then
    return 0
end
local fields = redis.call('hgetall', name)
for i = 1, #fields, 2 do
    local count = tonumber(fields[i + 1])
    if is_reader(fields[i]) and count then
        for n = 1, count do
            redis.call('del', timeout_key(fields[i], n))
        end
    end
end
tell_holders(name)
redis.call('del', name)
redis.call(PUBLISH, channel, '1')
return 1

--- script: hold_count
-- How many live holds an owner has (read-only): a reader's field that outlived
-- all its holds' keys counts 0.
--
-- ARGV[2]  owner field
local mode, wrong = read_mode()
if wrong then
    return wrong
end
local owner = ARGV[2]
local count = mode and tonumber(redis.call('hget', name, owner))
if not count or (is_reader(owner) and hold_ttl(owner, count) == -2) then
    return 0
end
return count

--- script: inspect
-- Read the lock for an inspection (see inspect.lua for the reply, whose
-- holders carry each one's remaining lease: a reader's longest hold, 0 when
-- all ended); the waiting writers are its queue. Tail: its mode, or ''.
local mode, wrong = read_mode()
if wrong then
    return wrong
end
local keys = existing({name, fences, writers})
local holders = {}
if mode then
    local fields = redis.call('hgetall', name)
    for i = 1, #fields, 2 do
        local field, count = fields[i], tonumber(fields[i + 1])
        if field ~= 'mode' and count then
            local ttl = ''
            if is_reader(field) then
                ttl = math.max(hold_ttl(field, count), 0)
                local timeouts = {}
                for n = 1, count do
                    timeouts[n] = timeout_key(field, n)
                end
                for _, found in ipairs(existing(timeouts)) do
                    keys[#keys + 1] = found
                end
            end
            holders[#holders + 1] = field
            holders[#holders + 1] = count
            holders[#holders + 1] = ttl
        end
    end
end
local line = {}
local waiting = raised(redis.pcall('zrange', writers, 0, -1, 'withscores'))
if not waiting.err then
    for i = 1, #waiting, 2 do
        line[#line + 1] = waiting[i]
        line[#line + 1] = tonumber(waiting[i + 1])
    end
end
return {clock_ms(), keys, holders, line, mode or ''}
