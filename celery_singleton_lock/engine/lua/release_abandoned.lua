-- Release the lock of a dead holder, by its owner fields: for a supervisor whose child died
-- holding a lock (it cannot know the child's token). The lock is looked for as a lock key,
-- then as a slot of its slot table (a lock_limit, includes/slot_table.lua).
-- KEYS[1]     lock key
-- KEYS[2..3]  its slot table: slots, slot-data
-- KEYS[4]     optional: the held index (includes/held_index.lua; one server only)
-- ARGV[1]     '<pid>|<host>|<task_id>' of the dead holder, host escaped as in the lock value
-- ARGV[2]     channel to publish the release on
-- ARGV[3]     the slot number it held ('' any: the one its owner holds)
-- Returns     1 released; 0 the lock is gone or held by another execution: nothing changed.
--- @include "slot_table"
--- @include "announce"
--- @include "held_index"

if ARGV[3] == '' or ARGV[3] == '1' then
  local v = redis.pcall('GET', KEYS[1])
  if type(v) == 'string' and string.sub(v, 33, 33) == '|' and owner_of(v) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    unindex_held(KEYS[4], KEYS[1])  -- held index
    announce(ARGV[2], KEYS[1])
    return 1
  end
end
local S, now = slot_keys(2, KEYS[4]), now_ms()
local slot, v
if ARGV[3] == '' then
  slot, v = slot_by(S, 'o:' .. ARGV[1], now)
else
  slot, v = ARGV[3], slot_read(S, ARGV[3], now)
end
if not v or string.sub(v, 33, 33) ~= '|' or owner_of(v) ~= ARGV[1] then
  return 0
end
slot_clear(S, slot, v)
slot_tidy(S, now)
announce(ARGV[2], KEYS[1])
return 1
