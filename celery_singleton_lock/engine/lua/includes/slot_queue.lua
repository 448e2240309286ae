-- Policy queue: calls parked behind the N slot keys KEYS[1..n] of a lock (slots.py; a mutex is
-- the lock with one slot, its key the lock key), with a cooldown and a rate; the parked set,
-- parked messages, hand-off index and reservation value are handoff.lua's.
--
-- - a slot is reserved for ONE parked task id at a time (the reservation value names it), and
--   the parked ids are handed free slots in arrival order, skipping the ids already holding a
--   reservation: so two slots are never reserved for one call, and no call overtakes an older
--   one;
-- - a parked id stays in the list until it takes its slot (or is dropped), so a reservation
--   that runs out (its message was never delivered) is made again for the same id by a
--   sweeper;
-- - with a rate, a reservation counts as a start of its own, scored at the latest the
--   reserved call can start (now + the reservation's life, member 'r:<task id>'), and the
--   call's real start replaces it when it takes its slot: a call is never handed a slot the
--   rate would refuse it, and the starts of the window are never more than the rate;
-- - a cooldown is a release that leaves the slot taken (cooldown.lua); the slot is handed on
--   when the cooldown ends, by the sweeper the index names it to;
-- - every script ends by writing the lock's due time in the hand-off index (schedule): the
--   soonest of a taken slot's TTL (a holder that may die, a cooldown or a reservation that
--   ends) and, with a free slot and an id waiting for it, now or the rate's next start. So
--   nothing polls: a sweeper looks at the lock when something can change, and a release
--   hands on at once.
--
-- The lock's rule (P:{N}:parked-rule: 'N|rate|window ms|live cap key', '' for no rate or no
-- cap key) is written when a call is parked and deleted with the last parked id: the sweeper,
-- which knows only the lock's name, reads it to call hand_on_slots.lua with the lock's keys.
--
-- `q` is the lock's queue: {starts, parked, messages, index, rule, rounds, name, reserve, rate,
-- window, cap} (keys, the lock name, the reservation's life in ms, the rate or nil, its window,
-- the live cap or nil).
--- @include "lock_value"
--- @include "handoff"
--- @include "rate"
--- @include "live_rule"

-- The slots KEYS[1..n] now: free slot indices (in order), parked ids holding a reservation
-- (id -> slot), the slot holding token (or nil), the slot held by an execution of task id
-- id (a copy, or nil), the slot that frees first and its PTTL (or nil). Raises NOTLOCK.
local function survey(n, token, id)
  local free, reserved, mine, copy, first, first_pttl = {}, {}, nil, nil, nil, nil
  local values = redis.call('MGET', unpack(KEYS, 1, n))  -- one call reads every slot
  for i = 1, n do
    local v = values[i]
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

-- The live cap (`celery locks limit`): at most q.cap slots taken at once (held, reserved or
-- cooling), whatever N; the free slots beyond it are not free. `free` is survey's list.
local function capped(q, n, free)
  free = paused_free(q, free)
  if q.cap then
    local allowed = math.max(q.cap - (n - #free), 0)
    while #free > allowed do
      table.remove(free)
    end
  end
  return free
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
  local walked = redis.call('ZRANGE', q.parked, 0, n + #free)
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
      redis.call('GET', KEYS[slot])  -- survey's MGET reads a key of another type as nil
      redis.call('SET', KEYS[slot], HANDOFF_TOKEN .. '||' .. now .. '|0||' .. id,
                 'PX', q.reserve)
      reserved[id] = slot
      handed[#handed + 1] = redis.call('HGET', q.messages, id) or ''
    end
  end
  return handed, free, true  -- the whole list: a longer one returned above
end

-- Write when a sweeper should next look at the lock (see above), or take it out of the index
-- (and drop its rule) when nothing is parked.
local function schedule(n, q, now)
  local waiting = redis.call('ZCARD', q.parked)
  if waiting == 0 then
    redis.call('ZREM', q.index, q.name)
    redis.call('DEL', q.rule, q.rounds)
    return
  end
  local free, reserved, _, _, _, first_pttl = survey(n, nil, nil)
  free = capped(q, n, free)
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
  due = paused_due(q, now, due)
  redis.call('ZADD', q.index, due or (now + q.reserve), q.name)
end
