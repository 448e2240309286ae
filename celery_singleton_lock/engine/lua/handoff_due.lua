-- The lock names a sweeper should look at now (see hand_on_slots.lua's 'sweep'), and when the
-- next one falls due, so that the sweeper sleeps until then rather than a whole interval.
-- KEYS[1]  hand-off index (or the index of superseded calls left to mark, see displace)
-- ARGV[1]  at most this many names
-- Returns  array: first the ms until the next name not returned falls due (0 when more are due
--          now than ARGV[1]; -1 when none is left), then the lock names due now by the
--          server's clock, oldest first.
--- @include "now_ms"

local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[1])
local next_due = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT',
                            0, 1)
local wait = -1
if #due >= tonumber(ARGV[1]) then
  wait = 0
elseif next_due[2] then
  wait = tonumber(next_due[2]) - now
end
table.insert(due, 1, wait)
return due
