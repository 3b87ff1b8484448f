-- Shared head of every script (prepended by src/lua.rs): reading what a
-- protected call (redis.pcall) failed with.
--
-- A script reads a key in a protected call to tell a key of another type
-- (WRONGTYPE) from its own, and names it in an error reply with nothing
-- changed. Any other failure is not about the key: the command was refused (a
-- permission taken away while the client runs, a server turned replica), and
-- reading it as a key of another type would name the wrong cause, or count a
-- held lock as lost. `raised` passes a reply on, and raises such a failure as
-- the script's own error, as redis.call would have.
local function raised(reply)
    if type(reply) == 'table' and reply.err and not string.find(reply.err, 'WRONGTYPE', 1, true) then
        error(reply)
    end
    return reply
end
