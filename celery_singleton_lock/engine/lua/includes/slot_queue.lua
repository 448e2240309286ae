-- Policy queue: calls parked behind the N slots of a lock (its slot table, slot_table.lua; a
-- mutex that queues is the lock with one slot), with a cooldown and a rate; the parked set,
-- parked messages, hand-off index and reservation value are handoff.lua's.
--
-- - a slot is reserved for ONE parked task id at a time (the reservation value names it), and
--   the parked ids are handed free slots in their order (arrival, rank, or turns across
--   fairness values), skipping the ids already holding a reservation: so two slots are never
--   reserved for one call, and no call overtakes one before it; with lock_fair_by the call
--   handed a turn is its value's best (fair_queue.lua);
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
-- `q` is the lock's queue: {S, starts, parked, messages, index, rule, rounds, fair, fair_ids,
-- name, reserve, rate, window, cap, paused} (its slot table, keys, the lock name, the
-- reservation's life in ms, the rate or nil, its window, the live rule's cap or nil and pause
-- or nil).
--- @include "slot_table"
--- @include "rate"
--- @include "live_rule"
--- @include "fair_queue"

-- The queue `q` of a lock whose slot table is KEYS[1..2] and whose other keys are KEYS[k..k+7]
-- (starts, parked, messages, index, rule, rounds, fair, fair_ids), as its scripts lay them
-- out: `held` the held index (or nil), the lock `name`, the ARGV texts of `reserve`, `rate`
-- and `window`, and the live rule read at `rule_key` (nil: none).
local function queue_of(k, held, name, reserve, rate, window, rule_key)
  local q = {S = slot_keys(1, held), starts = KEYS[k], parked = KEYS[k + 1],
             messages = KEYS[k + 2], index = KEYS[k + 3], rule = KEYS[k + 4],
             rounds = KEYS[k + 5], fair = KEYS[k + 6], fair_ids = KEYS[k + 7], name = name,
             reserve = tonumber(reserve), rate = tonumber(rate), window = tonumber(window),
             cap = nil, paused = nil}
  q.cap, q.paused = live_rule(rule_key)
  return q
end

-- How many of the first n slots a call may take now: the free ones, within the live rule's cap
-- (held, reserved and cooling slots all count as taken); none while the live rule pauses
-- the lock (q.paused).
local function room(q, n, now)
  if q.paused then
    return 0
  end
  local taken = slots_taken(q.S, now)
  local free = n - taken
  if q.cap then
    free = math.min(free, q.cap - taken)
  end
  return math.max(free, 0)
end

-- The slot reserved for parked task id `id`, or nil.
local function reserved_for(q, id, now)
  return (slot_by(q.S, 'r:' .. id, now))
end

-- The slot indexed as reserved for each of `ids` (or false), read 1,000 at a time.
local function reservations_of(q, ids)
  local found = {}
  for start = 1, #ids, 1000 do
    local fields = {}
    for i = start, math.min(start + 999, #ids) do
      fields[#fields + 1] = 'r:' .. ids[i]
    end
    for _, slot in ipairs(redis.call('HMGET', q.S.data, unpack(fields))) do
      found[#found + 1] = slot
    end
  end
  return found
end

-- Reserve free slots (`free` of them may be taken) for the parked ids without one, first
-- first (each turn of a fairness value to its best call), while the rate allows, stopping at
-- the first turn stop_id (the caller, who takes a slot itself) is the taker of, and after max
-- slots. That turn is its own, or, as its value's best call, its value's first turn: the
-- caller takes no turn another call of its value is the best for (its own included), nor
-- keeps its later turn when it takes its value's first (fair_take, by the caller once it
-- takes its slot: the rate may still refuse it one). Returns the handed messages, the room left,
-- whether the walk reached stop_id's turn or the end of the list (false: it stopped for the
-- rate or for max), and, reached, the parked id whose turn the caller takes and fair_turn's
-- member of the caller there (nil: not in the fair order).
local function hand_slots(n, q, free, now, max, stop_id)
  local handed = {}
  if free == 0 then
    return handed, free, false
  end
  -- at most n ids hold a reservation: n + free + 1 ids hold free + 1 without one
  local walked = redis.call('ZRANGE', q.parked, 0, n + free)
  local indexed = reservations_of(q, walked)
  -- with no slot's time come, every indexed reservation is live: no slot read per id
  local exact = redis.call('ZCOUNT', q.S.slots, 0, now) == 0
  local moved = {}  -- taker -> the id that now waits in its place (fair_take's swap)
  for i, id in ipairs(walked) do
    id = moved[id] or id
    if not (indexed[i] and (exact or reserved_for(q, id, now))) then
      if free == 0 or #handed >= max then
        return handed, free, false
      end
      local taker, member = fair_turn(q, id, now)
      if taker == stop_id then  -- the caller is this turn's taker: it takes the slot itself
        return handed, free, true, id, member
      end
      if q.rate then
        redis.call('ZREM', q.starts, 'r:' .. taker)
        if rate_wait(q.starts, q.rate, q.window, now) > 0 then
          return handed, free, false
        end
        redis.call('ZADD', q.starts, now + q.reserve, 'r:' .. taker)
        redis.call('PEXPIRE', q.starts, q.window + q.reserve)
      end
      local slot = slot_number(q.S, n, now)
      if not slot then
        return handed, 0, false
      end
      fair_take(q, id, taker, member)
      moved[taker] = id
      slot_put(q.S, slot, HANDOFF_TOKEN .. '||' .. now .. '|0||' .. taker, now, q.reserve, nil)
      free = free - 1
      handed[#handed + 1] = redis.call('HGET', q.messages, taker) or ''
    end
  end
  return handed, free, true  -- the whole list: a longer one returned above
end

-- Write when a sweeper should next look at the lock (see above), or take it out of the index
-- (and drop its rule) when nothing is parked; the slot table goes when no slot is taken.
-- Returns whether the index names the lock now (calls are parked).
local function schedule(n, q, now)
  local waiting = redis.call('ZCARD', q.parked)
  if waiting == 0 then
    redis.call('ZREM', q.index, q.name)
    redis.call('DEL', q.rule, q.rounds, q.fair, q.fair_ids)
  else
    local due
    if room(q, n, now) > 0 and waiting > slots_reserved(q.S) then
      due = now + rate_wait(q.starts, q.rate, q.window, now)
    end
    local _, first_pttl = slot_first(q.S, now)
    if first_pttl and (not due or now + first_pttl < due) then
      due = now + first_pttl
    end
    due = paused_due(q, now, due)
    redis.call('ZADD', q.index, due or (now + q.reserve), q.name)
  end
  slot_tidy(q.S, now)
  return waiting > 0
end
