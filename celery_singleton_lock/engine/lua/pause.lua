-- Pause (or resume) every start of a task's or group's locks: the 'until' field of its live
-- rule (includes/live_rule.lua), read by every acquire of those locks.
-- KEYS[1]  the live rule (hash, keys.py's cap_key; on a Redis Cluster one of its copies, one
--          per slot, each set by a call of its own: see live_rules.py)
-- KEYS[2]  the hand-off index (sorted set, keys.py's handoff_index; on a Cluster the copy's
--          slot's, keys.py' SharedKeys): set from the command line
--          (resumed, shortened), the family's parked locks are due now, so a sweeper re-reads
--          the rule at once (and hands their slots on, or looks again when the pause ends)
-- KEYS[3]  optional: the rule index (set, keys.py's rule_index): the family is added, so that
--          listing the rules needs no SCAN (on a Cluster, in another slot: added apart)
-- ARGV[1]  ms the pause lasts from now (server clock); '' until resumed; '0' resume now
-- ARGV[2]  '1': only lengthen a pause (a body's pause_for: a shorter one never cuts a longer
--          one short); '' set as asked (the command line)
-- ARGV[3]  the family's lock names' start (the family and a colon) in the hand-off index
-- Returns  {the pause's end in server ms (-1: until resumed; 0: not paused), how many parked
--          locks were made due now (on a Cluster the caller marks their slot in the summary
--          of due slots, slot_sweep.py)}
--- @include "now_ms"

local rule, index = KEYS[1], KEYS[2]
local now = now_ms()
local till = -1
if ARGV[1] ~= '' then
  local ms = tonumber(ARGV[1])
  till = ms > 0 and now + ms or 0
end
if ARGV[2] == '1' then
  local old = tonumber(redis.call('HGET', rule, 'until'))
  if old == -1 or (old and old >= till and till ~= -1) then
    return {old, 0}
  end
end
if till == 0 then
  redis.call('HDEL', rule, 'until')
else
  redis.call('HSET', rule, 'until', till)
  if KEYS[3] then
    redis.call('SADD', KEYS[3], string.sub(ARGV[3], 1, -2))
  end
end
if ARGV[2] == '1' then
  return {till, 0}  -- lengthened: every parked lock's next look is at or before its end already
end
-- the family's parked locks are looked at now: a sweeper re-reads the rule and schedules the
-- next look at the pause's end (includes/slot_queue.lua's schedule); O(index) for a command
-- that is rare, never on an acquire
local start, moved = ARGV[3], 0
for _, name in ipairs(redis.call('ZRANGE', index, 0, -1)) do
  if string.sub(name, 1, #start) == start then
    redis.call('ZADD', index, 'XX', now, name)
    moved = moved + 1
  end
end
return {till, moved}
