-- acquire_slot.lua for a task whose duplicates queue: take a free slot, or park this task id's
-- message behind the lock's N slots in arrival order, in one round trip. A free slot goes
-- to the oldest parked id without a reservation (reserved here, its message returned for
-- the caller to publish), not to a newer caller; a slot reserved for this id is taken over.
-- (How the slots are handed on: includes/slot_queue.lua.)
-- KEYS[1..N]  the N slot keys, slot 1 first (as acquire_slot.lua)
-- KEYS[N+1]   shared fence counter
-- KEYS[N+2]   the lock's starts (sorted set, as acquire_slot.lua), used with ARGV[5] only
-- KEYS[N+3]   parked task ids (sorted set)   KEYS[N+4]  parked messages (hash)
-- KEYS[N+5]   hand-off index           KEYS[N+6]  the lock's rule (see includes/slot_queue.lua)
-- KEYS[N+7]   the lock's parked rounds (hash, see includes/handoff.lua): the rounds with ARGV[11],
--             the arrival counter of every parked call
-- KEYS[N+8]   with ARGV[12] '1': the task's live rule (includes/live_rule.lua: a cap, see
--             includes/slot_queue.lua's capped, and a pause: the call parks, taking no slot,
--             not even one reserved for it)
-- KEYS[N+8+c] optional: the finish-record set to look in (as acquire_slot.lua's KEYS[N+3]);
--             c is 1 with the live cap, else 0
-- ARGV[1]     ttl in ms            ARGV[2]  the lock value with an empty fence
-- ARGV[3]     '1' to hand out a fence    ARGV[4]  N
-- ARGV[5]     at most this many starts in any window of ARGV[6] ms; '' none
-- ARGV[7]     the owner's task id (not empty)   ARGV[8]  its message, stored if parked
-- ARGV[9]     the lock name (member of the index)   ARGV[10]  ms a reservation lives
-- ARGV[11]    the call's fairness value (lock_fair_by): parked by rounds across values
--             (includes/handoff.lua's park_fair); '' parked in arrival order
-- ARGV[12]    '1' when KEYS[N+8] is the live cap; '' none
-- ARGV[13]    without ARGV[11]: the call's rank (its message's priority, higher: handed a
--             slot sooner; includes/park_priority.lua); '' or 0: arrival order
-- Returns     {slot, fence}: acquired the 1-based slot (also for a resend of the same token).
--             integer -1: the finish record exists; nothing changed.
--             string 'pttl|fence|acquired_at|pid|host|task_id': a slot is held by an
--               execution of this very task id (a copy): not parked, nothing changed.
--             array {holder, position, handed...}: parked (or already parked: kept where it
--               was); holder as the string above for the slot that frees first ('' if none
--               is taken), position this id's 1-based place, then the messages of the ids
--               just handed a free slot (the caller publishes each).
--             error NOTLOCK: a slot key holds a string that is not a lock value.
--- @include "slot_queue"
--- @include "finish_records"
--- @include "take_lock"
--- @include "live_rule"
--- @include "park_priority"

local n = tonumber(ARGV[4])
local c = ARGV[12] == '1' and 1 or 0
local id, token = ARGV[7], string.sub(ARGV[2], 1, 32)
local q = {starts = KEYS[n + 2], parked = KEYS[n + 3], messages = KEYS[n + 4],
           index = KEYS[n + 5], rule = KEYS[n + 6], rounds = KEYS[n + 7], name = ARGV[9],
           reserve = tonumber(ARGV[10]), rate = tonumber(ARGV[5]), window = tonumber(ARGV[6]),
           cap = nil, paused = nil}
q.cap, q.paused = live_rule(c == 1 and KEYS[n + 8] or nil)
if KEYS[n + 8 + c] and is_finished(KEYS[n + 8 + c], id) then
  return -1
end
local free, reserved, mine, copy, first, first_pttl = survey(n, token, id)
free = capped(q, n, free)
if mine then
  return {mine, fence_of(redis.call('GET', KEYS[mine]))}
end
local now = now_ms()
local take, handed = not q.paused and reserved[id], {}
if not take and copy then
  return redis.call('PTTL', KEYS[copy]) .. '|' .. string.sub(redis.call('GET', KEYS[copy]), 34)
end
if take then
  if q.rate then  -- its reservation counted as a start: its real start replaces it
    redis.call('ZREM', q.starts, 'r:' .. id)
    redis.call('ZADD', q.starts, now, token)
  end
else
  local reached
  handed, free, reached = hand_slots(n, q, free, reserved, now, n, id)
  if reached and #free > 0 then
    redis.call('ZREM', q.starts, 'r:' .. id)
    if rate_wait(q.starts, q.rate, q.window, now) == 0 then
      take = free[1]
      if q.rate then
        redis.call('ZADD', q.starts, now, token)
        redis.call('PEXPIRE', q.starts, q.window + q.reserve)
      end
    end
  end
end
if take then
  unpark(q.parked, q.messages, id)
  redis.call('GET', KEYS[take])  -- survey's MGET reads a key of another type as nil
  local fence = take_lock(KEYS[take], ARGV[2], ARGV[1], ARGV[3], KEYS[n + 1])
  schedule(n, q, now)
  return {take, fence}
end
local position
if ARGV[11] ~= '' then
  position = park_fair(q.parked, q.messages, q.rounds, id, ARGV[8], ARGV[11])
else
  position = park_ranked(q.parked, q.messages, q.rounds, id, ARGV[8], tonumber(ARGV[13]) or 0)
end
redis.call('SET', q.rule, n .. '|' .. ARGV[5] .. '|' .. ARGV[6] .. '|'
           .. (c == 1 and KEYS[n + 8] or ''))
schedule(n, q, now)
local holder = ''
if first then
  holder = first_pttl .. '|' .. string.sub(redis.call('GET', KEYS[first]), 34)
end
local reply = {holder, position}
for _, message in ipairs(handed) do
  reply[#reply + 1] = message
end
return reply
