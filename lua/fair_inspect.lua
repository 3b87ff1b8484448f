-- Read a fair lock for an inspection (see inspect.lua for the reply): its
-- holders, and its queue in order with when each place ends.
--
-- KEYS[1]  lock name
-- KEYS[2]  queue of waiter fields
-- KEYS[3]  zset of waiter field -> place deadline
-- KEYS[4]  fences of lost replies
local holders, wrong = holders_of(KEYS[1], '')
if wrong then
    return wrong
end
local line = {}
if redis.call('type', KEYS[2])['ok'] == 'list' then
    for _, waiter in ipairs(redis.call('lrange', KEYS[2], 0, -1)) do
        local deadline = redis.pcall('zscore', KEYS[3], waiter)
        line[#line + 1] = waiter
        if type(deadline) == 'string' then
            line[#line + 1] = tonumber(deadline)
        else
            line[#line + 1] = 0
        end
    end
end
return {clock_ms(), existing(KEYS), holders, line, ''}
