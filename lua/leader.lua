-- Leader election: one leader at a time, each term a hold of a fenced lock
-- (see holds.lua and tokens.lua) whose hash also keeps the term's record.
-- Composed by src/leader.rs; Redisson has no leader election, so the layout is
-- fredlock's own:
--
--   <name>                             hash: the leader's owner field -> hold
--                                      count, and while a term stands
--                                      "leader:identity", "leader:epoch",
--                                      "leader:since" (server clock, ms); its
--                                      TTL is the term's lease
--   fredlock_leader_epoch:{name}       epochs: a fencing token counter without
--                                      expiry, never backwards
--   fredlock_leader__channel:{name}    0 on every change (a term starts or
--                                      ends): every observer looks again
--   redisson_lock__channel:{name}      0 when a term ends: wakes the candidates
--
-- The record's fields cannot be an owner field (those start with a client's
-- uuid), so the holds' rules apply unchanged; a term's end deletes the hash.

local IDENTITY = 'leader:identity'
local EPOCH = 'leader:epoch'
local SINCE = 'leader:since'

--- script: acquire
-- Campaign: take the election for a term, or take it again.
--
-- KEYS[1]  election name
-- KEYS[2]  fences of lost replies
-- KEYS[3]  epoch counter
-- KEYS[4]  channel of changes
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner field
-- ARGV[3]  the owner's holds by its client's count
-- ARGV[4]  identity shown to observers
-- ARGV[5]  request id, then the ids to fence
--
-- Reply: {epoch, afresh} for a new term; nil for a re-entry its client counts;
-- otherwise the term's remaining time to live in ms (-1 without expiry), which
-- bounds how long a candidate sleeps before trying again.
local halted = fenced(KEYS[2], 4, ARGV[2], {KEYS[1]})
if halted then
    return halted
end
local reply, first = take_with_token(KEYS[1], ARGV[2], tonumber(ARGV[3]), ARGV[1], KEYS[3],
    'epoch counter of a leader election')
if first then
    local now = redis.call('time')
    local since = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    redis.call('hset', KEYS[1], IDENTITY, ARGV[4], EPOCH, reply[1], SINCE, since)
    redis.call(PUBLISH, KEYS[4], 0)
end
return reply

--- script: release
-- Resign: give back holds of a term; when none remain the term ends, its record
-- goes with it, and the end is announced to candidates and observers.
--
-- KEYS[1]  election name
-- KEYS[2]  unlock channel (candidates)
-- KEYS[3]  fences of lost replies
-- KEYS[4]  channel of changes (observers)
-- ARGV[1]  lease in milliseconds, applied again while holds remain (0: kept)
-- ARGV[2]  owner field
-- ARGV[3]  holds the owner keeps
-- ARGV[4]  request id, then the ids to fence
--
-- Reply: nil when the owner holds nothing, 0 when holds remain, 1 when the
-- term ended.
local halted = fenced(KEYS[3], 3, ARGV[2])
if halted then
    return halted
end
local released = give_back_holds(KEYS[1], ARGV[2], tonumber(ARGV[3]), ARGV[1])
if released == 1 then
    redis.call('del', KEYS[1])
    redis.call(PUBLISH, KEYS[2], 0)
    redis.call(PUBLISH, KEYS[4], 0)
end
return released

--- script: leader
-- Read the current term, read-only.
--
-- KEYS[1]  election name
--
-- Reply: {identity, epoch, since, owner field} while a term stands; otherwise
-- nil.
local record = raised(redis.pcall('hgetall', KEYS[1]))
if record['err'] then
    return redis.error_reply('WRONGTYPE not a leader election (a hash of holds): ' .. KEYS[1])
end
local identity, epoch, since, owner
for i = 1, #record, 2 do
    local field = record[i]
    if field == IDENTITY then
        identity = record[i + 1]
    elseif field == EPOCH then
        epoch = record[i + 1]
    elseif field == SINCE then
        since = record[i + 1]
    else
        owner = field
    end
end
if not owner or not epoch then
    return nil
end
return {identity or '', tonumber(epoch), tonumber(since or 0), owner}

--- script: changed
-- Whether the term is another than the one an observer saw, read-only.
--
-- KEYS[1]  election name
-- ARGV[1]  the epoch the observer saw, 0 for none
--
-- Reply: nil when the current epoch (0 without a term) differs; otherwise how
-- long the observer may sleep before looking again: the term's remaining time
-- to live in ms, or -1 (a watchdog period) without a term or an expiry.
local epoch = raised(redis.pcall('hget', KEYS[1], EPOCH))
if type(epoch) == 'table' then
    return redis.error_reply('WRONGTYPE not a leader election (a hash of holds): ' .. KEYS[1])
end
if (epoch or '0') ~= ARGV[1] then
    return nil
end
local pttl = redis.call('pttl', KEYS[1])
if pttl < 0 then
    return -1
end
return pttl

--- script: force_unlock
-- End the current term whoever leads, and tell the leader (see delete_lock.lua's
-- tell_holders), the candidates and the observers.
-- A key that is no election (a hash without a term's record, or another type)
-- is left alone and reported as WRONGTYPE.
--
-- KEYS[1]  election name
-- KEYS[2]  unlock channel
-- KEYS[3]  channel of changes
--
-- Reply: 1 when a term was ended, 0 when there was none.
local found = redis.call('type', KEYS[1])['ok']
if found == 'none' then
    return 0
end
if found ~= 'hash' or redis.call('hexists', KEYS[1], EPOCH) == 0 then
    return redis.error_reply('WRONGTYPE not a leader election (a hash of holds with a term): ' .. KEYS[1])
end
tell_holders(KEYS[1])
redis.call('del', KEYS[1])
redis.call(PUBLISH, KEYS[2], 0)
redis.call(PUBLISH, KEYS[3], 0)
return 1

--- script: inspect
-- Read an election for an inspection (see inspect.lua for the reply): the
-- leader as the holder. Tail: the last epoch (or ''), then the leader as the
-- leader script replies, {identity, epoch, since, owner field}, or {}.
--
-- KEYS[1]  election name
-- KEYS[2]  fences of lost replies
-- KEYS[3]  epoch counter
local fields = raised(redis.pcall('hgetall', KEYS[1]))
if fields['err'] then
    return redis.error_reply('WRONGTYPE not a leader election (a hash of holds): ' .. KEYS[1])
end
local record = {}
for i = 1, #fields, 2 do
    record[fields[i]] = fields[i + 1]
end
local holders = {}
local leader = {}
for i = 1, #fields, 2 do
    if string.sub(fields[i], 1, 7) ~= 'leader:' then
        holders[#holders + 1] = fields[i]
        holders[#holders + 1] = fields[i + 1]
        holders[#holders + 1] = ''
        if record[EPOCH] then
            leader = {record[IDENTITY] or '', tonumber(record[EPOCH]),
                      tonumber(record[SINCE] or 0), fields[i]}
        end
    end
end
return {clock_ms(), existing(KEYS), holders, {}, counter_of(KEYS[3]), leader}
