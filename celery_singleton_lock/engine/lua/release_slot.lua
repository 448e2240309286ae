-- Release a slot of a lock taken by up to N holders (its slot table, includes/slot_table.lua)
-- by its owner's token, as release.lua releases a lock key: the number is free again and the
-- release is published; or, with a cooldown (lock_cooldown), the slot stays taken by the run
-- that ended until the cooldown is over (as release_into_cooldown.lua).
-- KEYS[1..2]  the lock's slot table: slots, slot-data
-- KEYS[3]     optional: the held index (includes/held_index.lua; one server only): the table's
--             entry written with a cooldown's end, dropped when no slot is left taken
-- KEYS[#KEYS] with ARGV[4..5]: the finish-record set of the owner's task id (as release.lua's)
-- ARGV[1]     token of the releasing owner (32 characters)
-- ARGV[2]     channel to publish the release on
-- ARGV[3]     the cooldown in ms; '' none
-- ARGV[4..5]  optional: as release.lua's ARGV[3..4]
-- Returns     1 released (or into its cooldown); 0 not ours (expired, or taken over): nothing
--             changed.
--- @include "slot_table"
--- @include "finish_records"
--- @include "cooldown"
--- @include "announce"

local records = ARGV[5] and KEYS[#KEYS]
local held = #KEYS == (records and 4 or 3) and KEYS[3] or nil  -- held index
local S, now = slot_keys(1, held), now_ms()
local slot, v = redis.call('HGET', S.data, ARGV[1]), nil
-- the last holder leaving without a cooldown (a small limit's usual release) deletes the
-- table: its slot needs no value read nor index entry dropped. The token's entry is exact (a
-- slot's entries are written with its value and dropped when it is given back or written
-- again), so the slot it names, still live, is this token's.
local last = slot and ARGV[3] == '' and slot_alone(S, slot, now)
if not last then
  slot, v = slot_named(S, ARGV[1], slot, now)
  if not slot then
    return 0
  end
end
if records then
  record_finished(records, ARGV[4], ARGV[5])
end
if last then
  slot_drop(S)
elseif ARGV[3] ~= '' then
  slot_put(S, slot, cooled(v), now, tonumber(ARGV[3]), v)
else
  slot_clear(S, slot, v)
  slot_tidy(S, now)
end
announce(ARGV[2], S.slots)
return 1
