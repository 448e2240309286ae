-- The slots of a lock taken by up to N holders (lock_limit, lock_rate, policy queue): two keys
-- beside the lock key (same hash tag), both passed in KEYS, whose cost grows with the slots
-- taken (log n), never with N:
--   P:{N}:slots      sorted set, one member per slot number ever issued (1, 2, ... in order):
--                    scored by when it frees (ms, server clock) while taken (a holder's lease,
--                    a cooldown's or a reservation's end), or by number - FREE when given
--                    back (below any time: the smallest free number is the lowest score)
--   P:{N}:slot-data  hash: 'v<k>' -> the lock value of slot k (lock_value.lua); and the
--                    index: token -> slot, 'o:<pid>|<host>|<task id>' (its owner) -> slot,
--                    't:<task id>' -> slot, 'r:<task id>' (a reservation, handoff.lua) ->
--                    slot, '#r' -> how many reservations are indexed, '#' -> 1 (never empty)
-- A slot whose time has come (0 < score <= now) is free: every read skips it, an index entry
-- is believed only if the slot's value still says so, and an acquire that finds no number
-- given back gives back a bounded batch of them (each once: amortized O(1)). Both keys live at
-- least as long as their last slot, at most twice its time (slot_keep: one PTTL per write,
-- their TTL set again only when it is shorter), so a lock nobody takes again leaves nothing
-- behind; a writer that leaves no slot taken deletes them (slot_tidy) and the numbers start
-- again at 1.
-- `S` is {slots = KEYS[i], data = KEYS[i + 1], held = the held index or nil}: with the held
-- index (includes/held_index.lua; one server only), a write that takes or renews a slot
-- writes the table's slots key there, scored by that lease's end (a slot has no key of its
-- own: readers expand the entry into its live slots and drop it once the table key is gone),
-- and slot_tidy takes it out (acquire_slot.lua writes it only when it makes the table: the
-- entry lives as long as the table, and its score is read by no one).
--- @include "lock_value"
--- @include "handoff"
--- @include "held_index"

local FREE = 1e15

local function slot_keys(i, held)
  return {slots = KEYS[i], data = KEYS[i + 1], held = held}
end

-- The index fields of the value `v` (see above).
local function slot_fields(v)
  local token = string.sub(v, 1, 32)
  if token == HANDOFF_TOKEN then
    return {'r:' .. task_id_of(v)}
  end
  return {token, 'o:' .. (owner_of(v) or ''), 't:' .. task_id_of(v)}
end

-- Whether index `field` names the value `v`.
local function slot_names(field, v)
  local kind = string.sub(field, 1, 2)
  if kind == 'o:' then
    return owner_of(v) == string.sub(field, 3) and string.sub(v, 1, 32) ~= HANDOFF_TOKEN
  elseif kind == 't:' then
    return task_id_of(v) == string.sub(field, 3) and string.sub(v, 1, 32) ~= HANDOFF_TOKEN
  elseif kind == 'r:' then
    return string.sub(v, 1, 32) == HANDOFF_TOKEN and task_id_of(v) == string.sub(field, 3)
  end
  return string.sub(v, 1, 32) == field
end

-- Drop the index entries of value `v` that still point at slot `k`, and `extra` (a field).
local function slot_unindex(S, k, v, extra)
  local fields = slot_fields(v)
  local at = redis.call('HMGET', S.data, unpack(fields))
  local gone = {extra}
  for i, field in ipairs(fields) do
    if at[i] == k then
      gone[#gone + 1] = field
      if string.sub(field, 1, 2) == 'r:' then
        redis.call('HINCRBY', S.data, '#r', -1)
      end
    end
  end
  if #gone > 0 then
    redis.call('HDEL', S.data, unpack(gone))
  end
end

-- Keep both keys at least until `now` + `ms` (an expiry just written): their TTL, when shorter,
-- set to twice that (so most writes only read it).
local function slot_keep(S, now, ms)
  if redis.call('PTTL', S.slots) < ms then
    local at = string.format('%d', now + 2 * ms)
    redis.call('PEXPIREAT', S.slots, at)
    redis.call('PEXPIREAT', S.data, at)
  end
end

-- Write the value `v` of slot `k` and its index entries (slot_fields) in the hash.
local function slot_write(S, k, v)
  -- '#': the hash never empties (Redis would delete it, and a later HSET would make it again
  -- without the TTL that slot_keep reads off the slots key alone)
  local write = {'v' .. k, v, '#', '1'}
  for _, field in ipairs(slot_fields(v)) do
    write[#write + 1] = field
    write[#write + 1] = k
    if string.sub(field, 1, 2) == 'r:' then
      redis.call('HINCRBY', S.data, '#r', 1)
    end
  end
  redis.call('HSET', S.data, unpack(write))
end

-- Write slot `k` (a string) with the lock value `v` for `ms` ms from `now` (server clock);
-- `old`: the value it held, or nil when it was free.
local function slot_put(S, k, v, now, ms, old)
  if old then
    slot_unindex(S, k, old, nil)
  end
  slot_write(S, k, v)
  redis.call('ZADD', S.slots, now + ms, k)
  slot_keep(S, now, ms)
  if S.held then
    redis.call('ZADD', S.held, now + ms, S.slots)
  end
end

-- Take slot 1 of a table that is not there (slot_find said so): a small limit's holders
-- mostly find their table empty, deleted by the last release (slot_tidy), so this is the
-- common acquire, and it writes without reading: no number to look for, no TTL to compare.
local function slot_put_first(S, v, now, ms)
  if redis.call('ZADD', S.slots, 'NX', now + ms, '1') == 0 then
    -- a slots key without its hash: never by construction (both are written, expire and are
    -- deleted together), and its slots could not be named any more: started afresh
    redis.call('DEL', S.slots)
    redis.call('ZADD', S.slots, now + ms, '1')
  end
  slot_write(S, '1', v)
  local at = string.format('%d', now + 2 * ms)
  redis.call('PEXPIREAT', S.slots, at)
  redis.call('PEXPIREAT', S.data, at)
  if S.held then
    redis.call('ZADD', S.held, now + ms, S.slots)
  end
end

-- Give slot `k`, still taken, `ms` more ms from `now` (a renewal).
local function slot_extend(S, k, now, ms)
  redis.call('ZADD', S.slots, 'XX', now + ms, k)
  slot_keep(S, now, ms)
  if S.held then
    redis.call('ZADD', S.held, now + ms, S.slots)
  end
end

-- Give slot `k` back (its number free again); `old`: its value when the caller read it.
local function slot_clear(S, k, old)
  old = old or redis.call('HGET', S.data, 'v' .. k)
  if old then
    slot_unindex(S, k, old, 'v' .. k)
  end
  redis.call('ZADD', S.slots, 'XX', tonumber(k) - FREE, k)
end

-- Give back at most `most` slots whose time has come; how many.
local function slot_trim(S, now, most)
  local gone = redis.call('ZRANGEBYSCORE', S.slots, 0, now, 'LIMIT', 0, most)
  for _, k in ipairs(gone) do
    slot_clear(S, k, nil)
  end
  return #gone
end

-- The value of slot `k` and its ms left, or nil when it is free.
local function slot_read(S, k, now)
  local score = tonumber(redis.call('ZSCORE', S.slots, k))
  if not score or score <= now then
    return nil
  end
  return redis.call('HGET', S.data, 'v' .. k), score - now
end

-- The live slot `k` (a string from the index `field`, or nil) and its value, or nil unless
-- the value still says what the index does.
local function slot_named(S, field, k, now)
  if not k then
    return nil
  end
  local v = slot_read(S, k, now)
  if not v or not slot_names(field, v) then
    return nil
  end
  return k, v
end

-- The live slot the index `field` names and its value, or nil.
local function slot_by(S, field, now)
  return slot_named(S, field, redis.call('HGET', S.data, field), now)
end

-- The slot the index `field` names, unchecked (a string, or nil), and whether the table is
-- there at all ('#' is in every table's hash), in one read: an acquire that finds no table
-- takes slot 1 (slot_put_first) with nothing more read.
local function slot_find(S, field)
  local at = redis.call('HMGET', S.data, field, '#')
  return at[1] or nil, at[2] ~= false
end

-- Whether slot `k` (a string) is live and the only one in the table, numbers given back and
-- expired slots included (one read of its first two members by score): the last holder
-- leaving, whose release deletes the table (slot_drop) instead of giving its number back.
local function slot_alone(S, k, now)
  local first = redis.call('ZRANGE', S.slots, 0, 1, 'WITHSCORES')
  return #first == 2 and first[1] == k and tonumber(first[2]) > now
end

-- Delete both keys (and the table's held-index entry): its last slot given back.
local function slot_drop(S)
  redis.call('DEL', S.slots, S.data)
  unindex_held(S.held, S.slots)
end

-- How many slots are taken now (held, cooling or reserved).
local function slots_taken(S, now)
  return redis.call('ZCOUNT', S.slots, '(' .. now, '+inf')
end

-- How many slots are reserved (an upper bound until the expired ones are given back).
local function slots_reserved(S)
  return tonumber(redis.call('HGET', S.data, '#r') or '0')
end

-- The taken slot that frees first and its ms left, or nil.
local function slot_first(S, now)
  local first = redis.call('ZRANGEBYSCORE', S.slots, '(' .. now, '+inf', 'WITHSCORES',
                           'LIMIT', 0, 1)
  if not first[1] then
    return nil
  end
  return first[1], tonumber(first[2]) - now
end

-- The smallest free number <= n (a string), or nil when the first n are all taken.
local function slot_number(S, n, now)
  while true do
    local k = redis.call('ZRANGEBYSCORE', S.slots, '-inf', n - FREE, 'LIMIT', 0, 1)[1]
    if k then
      return k
    end
    local issued = redis.call('ZCARD', S.slots)
    if issued < n then
      return string.format('%d', issued + 1)
    end
    if slot_trim(S, now, 64) == 0 then  -- each slot is given back once: amortized
      return nil
    end
  end
end

-- Delete both keys when no slot is taken: the end of a writer that gave one back.
local function slot_tidy(S, now)
  if slots_taken(S, now) == 0 then
    slot_drop(S)
  end
end
