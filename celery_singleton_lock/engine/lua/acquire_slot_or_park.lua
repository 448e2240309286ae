-- acquire_slot.lua for a task whose duplicates queue: take a free slot, or park this task id's
-- message behind the lock's N slots in arrival order, in one round trip. A free slot goes
-- to the oldest parked id without a reservation (reserved here, its message returned for
-- the caller to publish), not to a newer caller; a slot reserved for this id is taken over.
-- With lock_fair_by, a free slot goes to the taker of the first turn without a reservation,
-- the best call of the turn's value (includes/fair_queue.lua), for this call too: parked, it
-- takes a slot at the first turn it is the taker of (as its value's best call, the value's
-- first turn: the call whose turn that was waits in this call's), and at its own turn, when
-- another call of its value is the best, hands the slot to that call and parks on in its turn.
-- (How the slots are handed on: includes/slot_queue.lua; the slot table: slot_table.lua.)
-- KEYS[1..2]  the lock's slot table: slots, slot-data
-- KEYS[3]     shared fence counter
-- KEYS[4]     the lock's starts (sorted set, as acquire_slot.lua), used with ARGV[5] only
-- KEYS[5]     parked task ids (sorted set)   KEYS[6]  parked messages (hash)
-- KEYS[7]     hand-off index           KEYS[8]  the lock's rule (see includes/slot_queue.lua)
-- KEYS[9]     the lock's parked rounds (hash, see includes/handoff.lua): the rounds with
--             ARGV[11], the arrival counter of every parked call
-- KEYS[10]    the lock's fair order (sorted set)   KEYS[11]  its members by task id (hash)
--             (includes/fair_queue.lua): the fair calls not yet handed a slot
-- KEYS[12]    with ARGV[12] '1': the task's live rule (includes/live_rule.lua: a cap, see
--             includes/slot_queue.lua's capped, and a pause: the call parks, taking no slot,
--             not even one reserved for it)
-- KEYS[12+c]  optional: the finish-record set to look in (as acquire_slot.lua's KEYS[5]);
--             c is 1 with the live rule, else 0
-- KEYS[#KEYS] with ARGV[14] '1': the held index (includes/held_index.lua; one server only):
--             a slot taken or reserved writes the table's slots key there
-- ARGV[1]     ttl in ms            ARGV[2]  the lock value with an empty fence
-- ARGV[3]     '1' to hand out a fence    ARGV[4]  N
-- ARGV[5]     at most this many starts in any window of ARGV[6] ms; '' none
-- ARGV[7]     the owner's task id (not empty)   ARGV[8]  its message, stored if parked
-- ARGV[9]     the lock name (member of the index)   ARGV[10]  ms a reservation lives
-- ARGV[11]    the call's fairness value (lock_fair_by): parked by rounds across values
--             (includes/fair_queue.lua's park_fair); '' parked in arrival order
-- ARGV[12]    '1' when KEYS[12] is the live rule; '' none
-- ARGV[13]    the call's rank (its message's priority, higher: handed a slot sooner;
--             includes/park_priority.lua; with ARGV[11], within its fairness value); '' or
--             0: arrival order
-- ARGV[14]    '1': KEYS[#KEYS] is the held index; '' none
-- Returns     {slot, fence}: acquired the 1-based slot (also for a resend of the same token).
--             integer -1: the finish record exists; nothing changed.
--             string 'pttl|fence|acquired_at|pid|host|task_id': a slot is held by an
--               execution of this very task id (a copy): not parked, nothing changed.
--             array {holder, position, paused, handed...}: parked (or already parked: kept
--               where it was); holder as the string above for the slot that frees first (''
--               if none is taken), position this id's 1-based place, paused the ms the live
--               rule's pause still lasts (-1: until resumed; 0: not paused: parked because
--               the slots are taken), then the messages of the ids just handed a free slot
--               (the caller publishes each).
--- @include "slot_queue"
--- @include "finish_records"
--- @include "take_lock"
--- @include "live_rule"
--- @include "park_priority"
--- @include "fair_queue"

local n = tonumber(ARGV[4])
local c = ARGV[12] == '1' and 1 or 0
local id, token = ARGV[7], string.sub(ARGV[2], 1, 32)
local held = ARGV[14] == '1' and KEYS[#KEYS] or nil  -- held index
local records = #KEYS > 11 + c + (held and 1 or 0) and KEYS[12 + c] or nil
local q = queue_of(4, held, ARGV[9], ARGV[10], ARGV[5], ARGV[6], c == 1 and KEYS[12] or nil)
if records and is_finished(records, id) then
  return -1
end
local now = now_ms()
local mine, there = slot_find(q.S, token)
-- the usual call of a queue nobody waits in: no table (every slot free) and nothing parked,
-- so slot 1 is taken with nothing more read and nothing to schedule (the hand-off index entry,
-- the rule and the rounds are deleted with the last parked id, includes/slot_queue.lua)
if not there and not q.paused and not q.rate and (q.cap or 1) >= 1
    and redis.call('ZCARD', q.parked) == 0 then
  local value, fence = fenced(ARGV[2], ARGV[3], KEYS[3])
  slot_put_first(q.S, value, now, tonumber(ARGV[1]))
  return {1, fence}
end
slot_trim(q.S, now, 16)
local v
mine, v = slot_named(q.S, token, mine, now)
if mine then
  return {tonumber(mine), fence_of(v)}
end
local take, reservation = slot_by(q.S, 'r:' .. id, now)
if q.paused then  -- paused: not even a slot reserved for it is taken
  take, reservation = nil, nil
end
local handed = {}
if not take then
  local copy, held = slot_by(q.S, 't:' .. id, now)
  if copy then
    local _, pttl = slot_read(q.S, copy, now)
    return pttl .. '|' .. string.sub(held, 34)
  end
end
local turn, member  -- the parked id whose turn this call takes, its fair-order member there
local holder = ''  -- the slot that frees first before this call hands any on
local first, first_pttl = slot_first(q.S, now)
if first then
  holder = first_pttl .. '|' .. string.sub(redis.call('HGET', q.S.data, 'v' .. first), 34)
end
if take then
  if q.rate then  -- its reservation counted as a start: its real start replaces it
    redis.call('ZREM', q.starts, 'r:' .. id)
    redis.call('ZADD', q.starts, now, token)
  end
else
  local free, reached = room(q, n, now), nil
  handed, free, reached, turn, member = hand_slots(n, q, free, now, n, id)
  if reached and free > 0 then
    redis.call('ZREM', q.starts, 'r:' .. id)
    if rate_wait(q.starts, q.rate, q.window, now) == 0 then
      take = slot_number(q.S, n, now)
      if take and q.rate then
        redis.call('ZADD', q.starts, now, token)
        redis.call('PEXPIRE', q.starts, q.window + q.reserve)
      end
    end
  end
end
if take then
  fair_take(q, turn, id, member)  -- takes turn's place: turn waits in this call's
  unpark(q.parked, q.messages, id)
  fair_forget(q, id)
  local value, fence = fenced(ARGV[2], ARGV[3], KEYS[3])
  slot_put(q.S, take, value, now, tonumber(ARGV[1]), reservation)
  schedule(n, q, now)
  return {tonumber(take), fence}
end
local position
if ARGV[11] ~= '' then
  position = park_fair(q, id, ARGV[8], ARGV[11], tonumber(ARGV[13]) or 0)
else
  position = park_ranked(q.parked, q.messages, q.rounds, id, ARGV[8], tonumber(ARGV[13]) or 0)
end
redis.call('SET', q.rule, n .. '|' .. ARGV[5] .. '|' .. ARGV[6] .. '|'
           .. (c == 1 and KEYS[12] or ''))
schedule(n, q, now)
local reply = {holder, position, q.paused or 0}
for _, message in ipairs(handed) do
  reply[#reply + 1] = message
end
return reply
