-- The slots of a lock taken by up to N holders (lock_limit, lock_rate, policy queue): four
-- keys beside the lock key (same hash tag), all passed in KEYS, whose cost grows with the
-- slots taken (log n), never with N:
--   P:{N}:slots        sorted set: slot number -> when it frees (ms, server clock): a holder's
--                      lease, a cooldown's or a reservation's end
--   P:{N}:slot-values  hash: slot number -> its lock value (lock_value.lua)
--   P:{N}:slot-index   hash: token -> slot, 'o:<pid>|<host>|<task id>' (its owner) -> slot,
--                      't:<task id>' -> slot, 'r:<task id>' (a reservation, handoff.lua)
--                      -> slot, and '#r' -> how many reservations there are
--   P:{N}:slot-free    sorted set: the numbers given back (each scored by itself). The numbers
--                      ever issued are 1..(ZCARD slots + ZCARD free), each in one of the two
--                      sets; the smallest free number <= N is the lowest freed one, else the
--                      next never issued.
-- A slot whose time has come (score <= now) is free: every read skips it, and the writers
-- give a bounded number of them back per call (trim: amortized O(1), each slot once). Every
-- key expires when the last slot does (slot_expire), so a lock nobody takes again leaves
-- nothing behind; when no slot is taken the numbers start again at 1.
-- `S` is {slots = KEYS[i], values = KEYS[i + 1], index = KEYS[i + 2], free = KEYS[i + 3]}.
--- @include "lock_value"
--- @include "handoff"

local function slot_keys(i)
  return {slots = KEYS[i], values = KEYS[i + 1], index = KEYS[i + 2], free = KEYS[i + 3]}
end

-- The index fields of the value `v` (see above).
local function slot_fields(v)
  local token = string.sub(v, 1, 32)
  if token == HANDOFF_TOKEN then
    return {'r:' .. task_id_of(v)}
  end
  return {token, 'o:' .. (owner_of(v) or ''), 't:' .. task_id_of(v)}
end

local function slot_unindex(S, k, v)
  for _, field in ipairs(slot_fields(v)) do
    if redis.call('HGET', S.index, field) == k then
      redis.call('HDEL', S.index, field)
      if string.sub(field, 1, 2) == 'r:' then
        redis.call('HINCRBY', S.index, '#r', -1)
      end
    end
  end
end

-- Write slot `k` (a string) with the lock value `v` until `expiry` (ms, server clock).
local function slot_put(S, k, v, expiry)
  local old = redis.call('HGET', S.values, k)
  if old then
    slot_unindex(S, k, old)
  end
  redis.call('HSET', S.values, k, v)
  redis.call('ZADD', S.slots, expiry, k)
  redis.call('ZREM', S.free, k)
  for _, field in ipairs(slot_fields(v)) do
    redis.call('HSET', S.index, field, k)
    if string.sub(field, 1, 2) == 'r:' then
      redis.call('HINCRBY', S.index, '#r', 1)
    end
  end
end

-- Give slot `k` back (its number free again).
local function slot_clear(S, k)
  local old = redis.call('HGET', S.values, k)
  if old then
    slot_unindex(S, k, old)
    redis.call('HDEL', S.values, k)
  end
  if redis.call('ZREM', S.slots, k) == 1 then
    redis.call('ZADD', S.free, k, k)
  end
end

-- Give back at most `most` slots whose time has come; how many.
local function slot_trim(S, now, most)
  local gone = redis.call('ZRANGEBYSCORE', S.slots, '-inf', now, 'LIMIT', 0, most)
  for _, k in ipairs(gone) do
    slot_clear(S, k)
  end
  return #gone
end

-- The value of slot `k` and its ms left, or nil when it is free.
local function slot_read(S, k, now)
  local score = redis.call('ZSCORE', S.slots, k)
  if not score or tonumber(score) <= now then
    return nil
  end
  return redis.call('HGET', S.values, k), tonumber(score) - now
end

-- The live slot the index `field` names and its value, or nil.
local function slot_by(S, field, now)
  local k = redis.call('HGET', S.index, field)
  if not k then
    return nil
  end
  local v = slot_read(S, k, now)
  if not v then
    return nil
  end
  return k, v
end

-- How many slots are taken now (held, cooling or reserved).
local function slots_taken(S, now)
  return redis.call('ZCOUNT', S.slots, '(' .. now, '+inf')
end

-- How many slots are reserved (an upper bound until the expired ones are trimmed).
local function slots_reserved(S)
  return tonumber(redis.call('HGET', S.index, '#r') or '0')
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
    local k = redis.call('ZRANGEBYSCORE', S.free, '-inf', n, 'LIMIT', 0, 1)[1]
    if k then
      return k
    end
    local issued = redis.call('ZCARD', S.slots) + redis.call('ZCARD', S.free)
    if issued < n then
      return string.format('%d', issued + 1)
    end
    if slot_trim(S, now, 64) == 0 then  -- each slot is given back once: amortized
      return nil
    end
  end
end

-- Every key expires with the last slot (or goes now when none is taken): end of a writer.
local function slot_expire(S)
  local last = redis.call('ZRANGE', S.slots, -1, -1, 'WITHSCORES')
  if not last[2] then
    redis.call('DEL', S.values, S.index, S.free)
    return
  end
  local at = string.format('%d', tonumber(last[2]) + 1)
  redis.call('PEXPIREAT', S.slots, at)
  redis.call('PEXPIREAT', S.values, at)
  redis.call('PEXPIREAT', S.index, at)
  redis.call('PEXPIREAT', S.free, at)
end
