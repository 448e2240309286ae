"""Lua scripts of policy ``queue`` over N slots (``lock_limit``), a cooldown and a rate, each
headed by its contract: ACQUIRE_SLOT_OR_PARK and HAND_ON_SLOTS.

They extend the mutex's hand-off queue (:mod:`.queue_scripts`: the same parked list, parked
messages, hand-off index and reservation value) to the N slot keys of :mod:`.slots`:

- a slot is reserved for ONE parked task id at a time (the reservation value names it), and
  the parked ids are handed free slots in arrival order, skipping the ids already holding a
  reservation: so two slots are never reserved for one call, and no call overtakes an older
  one;
- a parked id stays in the list until it takes its slot (or is dropped), so a reservation
  that runs out (its message was never delivered) is made again for the same id by a
  sweeper;
- with a rate, a reservation counts as a start of its own, scored at the latest the
  reserved call can start (now + the reservation's life, member ``r:<task id>``), and the
  call's real start replaces it when it takes its slot: a call is never handed a slot the
  rate would refuse it, and the starts of the window are never more than the rate;
- a cooldown is a release that leaves the slot taken (:mod:`.cooldown`); the slot is handed
  on when the cooldown ends, by the sweeper the index names it to;
- every script ends by writing the lock's due time in the hand-off index: the soonest of a
  taken slot's TTL (a holder that may die, a cooldown or a reservation that ends) and, with a
  free slot and an id waiting for it, now or the rate's next start. So nothing polls: a
  sweeper looks at the lock when something can change, and a release hands on at once.

The lock's rule (``P:{N}:parked-rule``: ``N|rate|window ms``, '' for no rate) is written when
a call is parked and deleted with the last parked id: the sweeper, which knows only the
lock's name, reads it to call HAND_ON_SLOTS with the lock's slot keys.
"""

from __future__ import annotations

from celery_singleton_lock.engine.cooldown import COOLDOWN_PID, COOLDOWN_TOKEN
from celery_singleton_lock.engine.queue_scripts import _HANDOFF_FUNCTIONS
from celery_singleton_lock.engine.shared_keys import FUNCTIONS

_SLOT_FUNCTIONS = """
-- The slots KEYS[1..n] now: free slot indices (in order), parked ids holding a reservation
-- (id -> slot), the slot holding token (or nil), the slot held by an execution of task id
-- id (a copy, or nil), the slot that frees first and its PTTL (or nil). Raises NOTLOCK.
local function survey(n, token, id)
  local free, reserved, mine, copy, first, first_pttl = {}, {}, nil, nil, nil, nil
  for i = 1, n do
    local v = redis.call('GET', KEYS[i])
    if not v then
      free[#free + 1] = i
    else
      if string.sub(v, 33, 33) ~= '|' then
        error({err = 'NOTLOCK ' .. KEYS[i] .. ' holds a value that is not a lock'})
      end
      local t, holder = string.sub(v, 1, 32), task_id_of(v)
      if t == token then
        mine = i
      elseif t == HANDOFF_TOKEN then
        reserved[holder] = i
      elseif id and holder == id then
        copy = copy or i
      end
      local pttl = redis.call('PTTL', KEYS[i])
      if pttl >= 0 and (not first_pttl or pttl < first_pttl) then
        first, first_pttl = i, pttl
      end
    end
  end
  return free, reserved, mine, copy, first, first_pttl
end

-- ms until the rate allows one more start (0: now); the window's old starts trimmed.
local function rate_wait(starts, rate, window, now)
  if not rate then
    return 0
  end
  redis.call('ZREMRANGEBYSCORE', starts, '-inf', now - window)
  if redis.call('ZCARD', starts) < rate then
    return 0
  end
  local oldest = redis.call('ZRANGE', starts, 0, 0, 'WITHSCORES')
  return math.max(1, tonumber(oldest[2]) + window - now)
end

-- Reserve free slots for the parked ids without one, oldest first, while the rate allows,
-- stopping at stop_id (the caller, who takes a slot itself) and after max slots. Returns
-- the handed messages, the slots still free, and whether the walk reached stop_id or the
-- end of the list (false: it stopped for the rate or for max).
local function hand_slots(n, q, free, reserved, now, max, stop_id)
  local handed = {}
  if #free == 0 then
    return handed, free, false
  end
  -- at most n ids hold a reservation: n + #free + 1 ids hold #free + 1 without one
  local walked = redis.call('LRANGE', q.parked, 0, n + #free)
  for _, id in ipairs(walked) do
    if id == stop_id then
      return handed, free, true
    end
    if not reserved[id] then
      if #free == 0 or #handed >= max then
        return handed, free, false
      end
      if q.rate then
        redis.call('ZREM', q.starts, 'r:' .. id)
        if rate_wait(q.starts, q.rate, q.window, now) > 0 then
          return handed, free, false
        end
        redis.call('ZADD', q.starts, now + q.reserve, 'r:' .. id)
        redis.call('PEXPIRE', q.starts, q.window + q.reserve)
      end
      local slot = table.remove(free, 1)
      redis.call('SET', KEYS[slot], HANDOFF_TOKEN .. '||' .. now .. '|0||' .. id,
                 'PX', q.reserve)
      reserved[id] = slot
      handed[#handed + 1] = redis.call('HGET', q.messages, id) or ''
    end
  end
  return handed, free, true  -- the whole list: a longer one returned above
end

-- Write when a sweeper should next look at the lock (see the module doc), or take it out
-- of the index (and drop its rule) when nothing is parked.
local function schedule(n, q, now)
  local waiting = redis.call('LLEN', q.parked)
  if waiting == 0 then
    redis.call('ZREM', q.index, q.name)
    redis.call('DEL', q.rule)
    return
  end
  local free, reserved, _, _, _, first_pttl = survey(n, nil, nil)
  local due
  local holding = 0
  for _ in pairs(reserved) do
    holding = holding + 1
  end
  if #free > 0 and waiting > holding then
    due = now + rate_wait(q.starts, q.rate, q.window, now)
  end
  if first_pttl and (not due or now + first_pttl < due) then
    due = now + first_pttl
  end
  redis.call('ZADD', q.index, due or (now + q.reserve), q.name)
end
"""

ACQUIRE_SLOT_OR_PARK = (
    """
-- ACQUIRE_SLOT for a task whose duplicates queue: take a free slot, or park this task id's
-- message behind the lock's N slots in arrival order, in one round trip. A free slot goes
-- to the oldest parked id without a reservation (reserved here, its message returned for
-- the caller to publish), not to a newer caller; a slot reserved for this id is taken over.
-- KEYS[1..N]  the N slot keys, slot 1 first (as ACQUIRE_SLOT)
-- KEYS[N+1]   shared fence counter     KEYS[N+2]  per-name fence counter of earlier builds
-- KEYS[N+3]   the lock's starts (sorted set, as ACQUIRE_SLOT), used with ARGV[5] only
-- KEYS[N+4]   parked task ids (list)   KEYS[N+5]  parked messages (hash)
-- KEYS[N+6]   hand-off index           KEYS[N+7]  the lock's rule (see module doc)
-- KEYS[N+8]   optional: the finish-record bucket prefix; KEYS[N+9] with it: the earlier
--             builds' finish record (as ACQUIRE_SLOT's KEYS[N+4], KEYS[N+5])
-- ARGV[1]     ttl in ms            ARGV[2]  the lock value with an empty fence
-- ARGV[3]     '1' to hand out a fence    ARGV[4]  N
-- ARGV[5]     at most this many starts in any window of ARGV[6] ms; '' none
-- ARGV[7]     the owner's task id (not empty)   ARGV[8]  its message, stored if parked
-- ARGV[9]     the lock name (member of the index)   ARGV[10]  ms a reservation lives
-- ARGV[11]    '1': an upgrade is under way   ARGV[12]  with KEYS[N+8]: the records' lifetime
-- Returns     {slot, fence}: acquired the 1-based slot (also for a resend of the same token).
--             integer -1: the finish record exists; nothing changed.
--             string 'pttl|fence|acquired_at|pid|host|task_id': a slot is held by an
--               execution of this very task id (a copy): not parked, nothing changed.
--             array {holder, position, handed...}: parked (or already parked: kept where it
--               was); holder as the string above for the slot that frees first ('' if none
--               is taken), position this id's 1-based place, then the messages of the ids
--               just handed a free slot (the caller publishes each).
--             error NOTLOCK: a slot key holds a string that is not a lock value.
"""
    + _HANDOFF_FUNCTIONS
    + FUNCTIONS
    + _SLOT_FUNCTIONS
    + """
local n = tonumber(ARGV[4])
local id, token = ARGV[7], string.sub(ARGV[2], 1, 32)
local q = {starts = KEYS[n + 3], parked = KEYS[n + 4], messages = KEYS[n + 5],
           index = KEYS[n + 6], rule = KEYS[n + 7], name = ARGV[9],
           reserve = tonumber(ARGV[10]), rate = tonumber(ARGV[5]), window = tonumber(ARGV[6])}
if KEYS[n + 8] and is_finished(KEYS[n + 8], ARGV[12], id, KEYS[n + 9]) then
  return -1
end
local free, reserved, mine, copy, first, first_pttl = survey(n, token, id)
if mine then
  return {mine, fence_of(redis.call('GET', KEYS[mine]))}
end
local now = now_ms()
local take, handed = reserved[id], {}
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
  redis.call('LREM', q.parked, 1, id)
  redis.call('HDEL', q.messages, id)
  local fence = take_lock(KEYS[take], ARGV[2], ARGV[1], ARGV[3], KEYS[n + 1], KEYS[n + 2], ARGV[11])
  schedule(n, q, now)
  return {take, fence}
end
local position
if redis.call('HSETNX', q.messages, id, ARGV[8]) == 1 then
  position = redis.call('RPUSH', q.parked, id)
else
  position = 0
  for i, parked_id in ipairs(redis.call('LRANGE', q.parked, 0, -1)) do
    if parked_id == id then
      position = i
      break
    end
  end
end
redis.call('SET', q.rule, n .. '|' .. ARGV[5] .. '|' .. ARGV[6])
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
"""
)

HAND_ON_SLOTS = (
    """
-- The release of one slot of a task whose duplicates queue (ARGV[4] 'release'), a sweeper's
-- step (ARGV[4] 'sweep') or the drop of a parked id that will never run (ARGV[4] 'drop'),
-- each followed by the hand-off of the free slots to the parked ids without a reservation,
-- oldest first, as far as the rate allows.
-- KEYS[1..N]  the N slot keys       KEYS[N+1]  the lock's starts (sorted set)
-- KEYS[N+2]   parked task ids       KEYS[N+3]  parked messages      KEYS[N+4]  hand-off index
-- KEYS[N+5]   the lock's rule
-- KEYS[N+6]   optional ('release' only): the finish-record bucket prefix; KEYS[N+7] with it:
--             the earlier builds' finish record (as RELEASE's KEYS[2], KEYS[3])
-- ARGV[1]     N   ARGV[2]  the rate's starts ('' none)   ARGV[3]  its window in ms
-- ARGV[4]     'release', 'sweep' or 'drop'
-- ARGV[5]     'release': the releasing owner's token; 'drop': the task id to drop
-- ARGV[6]     channel to publish a release on   ARGV[7]  the lock name (index member)
-- ARGV[8]     ms a reservation lives
-- ARGV[9]     'release': the cooldown in ms ('' none): the slot stays taken that long, with
--             the token '"""
    + COOLDOWN_TOKEN
    + """' and pid '"""
    + COOLDOWN_PID
    + """' (as RELEASE_INTO_COOLDOWN), and is
--             handed on when it ends; nothing is published then
-- ARGV[10..12] with KEYS[N+6]: as RELEASE's ARGV[3..5]
-- Returns     {done, handed...}: done 1 when released ('release': 0 if the token held no
--             slot: nothing released), dropped ('drop': 0 if the id was neither parked nor
--             reserved for) or swept; then the messages of the ids just handed a slot, to
--             publish. 'drop' hands at most one slot (the sweeper does the rest).
--             error NOTLOCK: a slot key holds a string that is not a lock value.
"""
    + _HANDOFF_FUNCTIONS
    + FUNCTIONS
    + _SLOT_FUNCTIONS
    + """
local n, mode = tonumber(ARGV[1]), ARGV[4]
local q = {starts = KEYS[n + 1], parked = KEYS[n + 2], messages = KEYS[n + 3],
           index = KEYS[n + 4], rule = KEYS[n + 5], name = ARGV[7],
           reserve = tonumber(ARGV[8]), rate = tonumber(ARGV[2]), window = tonumber(ARGV[3])}
local done, max = 1, n
if mode == 'release' then
  local slot
  for i = 1, n do
    if redis.call('GETRANGE', KEYS[i], '0', '31') == ARGV[5] then
      slot = i
      break
    end
  end
  if not slot then
    return {0}
  end
  local v = redis.call('GET', KEYS[slot])
  if KEYS[n + 6] then
    record_release(KEYS[n + 6], ARGV[10], ARGV[11], ARGV[12], KEYS[n + 7], v)
  end
  if ARGV[9] ~= '' then
    local fence_end = string.find(v, '|', 34, true)
    local acquired_end = string.find(v, '|', fence_end + 1, true)
    local pid_end = string.find(v, '|', acquired_end + 1, true)
    redis.call('SET', KEYS[slot], '"""
    + COOLDOWN_TOKEN
    + """' .. string.sub(v, 33, acquired_end) .. '"""
    + COOLDOWN_PID
    + """' .. string.sub(v, pid_end), 'PX', ARGV[9])
  else
    redis.call('DEL', KEYS[slot])
    redis.call('PUBLISH', ARGV[6], KEYS[slot])
  end
elseif mode == 'drop' then
  local id = ARGV[5]
  done = math.min(1, redis.call('LREM', q.parked, 0, id) + redis.call('HDEL', q.messages, id))
  for i = 1, n do
    local v = redis.call('GET', KEYS[i])
    if v and string.sub(v, 1, 32) == HANDOFF_TOKEN and task_id_of(v) == id then
      redis.call('DEL', KEYS[i])
      redis.call('ZREM', q.starts, 'r:' .. id)
      done = 1
    end
  end
  max = 1
end
local now = now_ms()
local free, reserved = survey(n, nil, nil)
local handed = hand_slots(n, q, free, reserved, now, max, nil)
schedule(n, q, now)
local reply = {done}
for _, message in ipairs(handed) do
  reply[#reply + 1] = message
end
return reply
"""
)
