-- The release of one slot of a task whose duplicates queue (ARGV[4] 'release'), a sweeper's
-- step (ARGV[4] 'sweep') or the drop of a parked id that will never run (ARGV[4] 'drop'),
-- each followed by the hand-off of the free slots to the parked ids without a reservation,
-- oldest first, as far as the rate allows (includes/slot_queue.lua); or (ARGV[4] 'sent') the
-- word that a handed id's message was published: its reservation, made short so that a death
-- before the publish stalls nobody for long, now lives its full time.
-- KEYS[1..2]  the lock's slot table: slots, slot-data (includes/slot_table.lua)
-- KEYS[3]     the lock's starts (sorted set)
-- KEYS[4]     parked task ids       KEYS[5]  parked messages      KEYS[6]  hand-off index
-- KEYS[7]     the lock's rule       KEYS[8]  the lock's parked rounds (deleted with the last
--             parked call)
-- KEYS[9]     the lock's fair order   KEYS[10]  its members by task id (includes/fair_queue.lua:
--             each turn of a fairness value goes to its best call)
-- KEYS[11]    with ARGV[10] '1': the task's live rule (includes/live_rule.lua: a cap, see
--             includes/slot_queue.lua's room, and a pause: no slot handed on meanwhile)
-- KEYS[11+c]  optional: the held index (includes/held_index.lua; one server only): a slot
--             reserved or cooling writes the table's slots key there, a table left empty is
--             taken out; c is 1 with the live rule, else 0
-- KEYS[#KEYS] with ARGV[11..12] ('release' only): the finish-record set (as release.lua's)
-- ARGV[1]     N   ARGV[2]  the rate's starts ('' none)   ARGV[3]  its window in ms
-- ARGV[4]     'release', 'sweep', 'drop' or 'sent'
-- ARGV[5]     'release': the releasing owner's token; 'drop': the task id to drop; 'sent': the
--             task id whose message was published
-- ARGV[6]     channel to publish a release on   ARGV[7]  the lock name (index member)
-- ARGV[8]     ms a reservation lives ('sent': ms it lives from now on)
-- ARGV[9]     'release': the cooldown in ms ('' none): the slot stays taken that long (as
--             release_into_cooldown.lua), and is handed on when it ends; nothing is
--             published then
-- ARGV[10]    '1' when KEYS[11] is the live rule; '' none
-- ARGV[11..12] with the finish-record set: as release.lua's ARGV[3..4]
-- The slots handed on are the first N, or fewer when the lock's rule (written by the newest
-- parked call) names fewer: a limit lowered while calls are parked (a callable lock_limit)
-- frees no slot above it, and its releases hand on none.
-- Returns     {done, handed...}: done 1 when released ('release': 0 if the token held no
--             slot: nothing released; 2 released with calls left parked, whose lock the
--             hand-off index names at its next due time: slot_sweep.py's summary is marked), dropped ('drop': 0 if the id was neither parked nor
--             reserved for), swept, or 'sent' (0 if no slot is reserved for the id: it took
--             its slot already, or its reservation ran out); then the messages of the ids
--             just handed a slot, to publish. 'drop' hands at most one slot (the sweeper does
--             the rest), 'sent' none.
--- @include "slot_queue"
--- @include "finish_records"
--- @include "cooldown"
--- @include "announce"
--- @include "live_rule"
--- @include "fair_queue"

local n, mode = tonumber(ARGV[1]), ARGV[4]
local c = ARGV[10] == '1' and 1 or 0
local records = ARGV[12] and KEYS[#KEYS]
local held = #KEYS == 11 + c + (records and 1 or 0) and KEYS[11 + c] or nil  -- held index
local q = queue_of(3, held, ARGV[7], ARGV[8], ARGV[2], ARGV[3], c == 1 and KEYS[11] or nil)
local now = now_ms()
local done, max = 1, n
if mode == 'release' then
  local slot, v = redis.call('HGET', q.S.data, ARGV[5]), nil
  -- the last holder leaving, no cooldown, nothing parked (a queue nobody waits in): the table
  -- deleted, nothing to hand on or schedule (as release_slot.lua's last holder)
  if slot and ARGV[9] == '' and slot_alone(q.S, slot, now)
      and redis.call('ZCARD', q.parked) == 0 then
    if records then
      record_finished(records, ARGV[11], ARGV[12])
    end
    slot_drop(q.S)
    announce(ARGV[6], q.S.slots)
    return {1}
  end
  slot, v = slot_named(q.S, ARGV[5], slot, now)
  if not slot then
    return {0}
  end
  if records then
    record_finished(records, ARGV[11], ARGV[12])
  end
  if ARGV[9] ~= '' then
    slot_put(q.S, slot, cooled(v), now, tonumber(ARGV[9]), v)
  else
    slot_clear(q.S, slot, v)
    announce(ARGV[6], q.S.slots)
  end
elseif mode == 'drop' then
  local id = ARGV[5]
  done = math.min(1, unpark(q.parked, q.messages, id))
  fair_forget(q, id)
  local slot, v = slot_by(q.S, 'r:' .. id, now)
  if slot then
    slot_clear(q.S, slot, v)
    redis.call('ZREM', q.starts, 'r:' .. id)
    done = 1
  end
  max = 1
elseif mode == 'sent' then
  local id = ARGV[5]
  done = 0
  local slot = reserved_for(q, id, now)
  if slot then
    slot_extend(q.S, slot, now, q.reserve)
    if q.rate then  -- its start counts at the latest it can now come (slot_queue.lua)
      redis.call('ZADD', q.starts, 'XX', now + q.reserve, 'r:' .. id)
      redis.call('PEXPIRE', q.starts, q.window + q.reserve)
    end
    done = 1
  end
  max = 0
end
slot_trim(q.S, now, 16)
local rule = redis.call('GET', q.rule)
if rule then
  n = math.min(n, tonumber(string.match(rule, '^(%d+)|')) or n)
end
local handed = hand_slots(n, q, room(q, n, now), now, max, nil)
if schedule(n, q, now) and mode == 'release' and done == 1 then
  done = 2  -- calls are left parked: their next due time is in the index
end
local reply = {done}
for _, message in ipairs(handed) do
  reply[#reply + 1] = message
end
return reply
