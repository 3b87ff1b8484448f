-- Read a lock of the reentrant family (reentrant, spin, fenced) for an
-- inspection (see inspect.lua for the reply).
--
-- KEYS[1]  lock name
-- KEYS[2]  fences of lost replies
-- KEYS[3]  (fenced lock) the token counter
local token = ''
if KEYS[3] then
    token = counter_of(KEYS[3])
end
local holders, wrong = holders_of(KEYS[1], token)
if wrong then
    return wrong
end
return {clock_ms(), existing(KEYS), holders, {}, token}
