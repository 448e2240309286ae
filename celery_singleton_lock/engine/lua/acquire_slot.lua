-- Take one of the N slots of a lock (lock_limit), as far as the rate allows (lock_rate).
-- KEYS[1..N]  the N slot keys of one lock, slot 1 first (KEYS[1] is the lock key itself)
-- KEYS[N+1]   the shared fence counter (see includes/take_lock.lua)
-- KEYS[N+2]   the lock's body starts (sorted set: token scored by the server's clock in ms,
--             see includes/rate.lua), used with ARGV[5] only
-- KEYS[N+3]   the finish-record set of the owner's task id (as acquire.lua's KEYS[3]), used
--             with ARGV[8] only: when the record lives, nothing is taken
-- KEYS[N+4]   optional: the task's live rule (includes/live_rule.lua: a cap, at most that
--             many slots taken at once whatever N, and a pause)
-- ARGV[1]     ttl in ms
-- ARGV[2]     the lock value with an empty fence: '<token>||<acquired_at>|<pid>|<host>|<task_id>'
-- ARGV[3]     '1' to hand out a fence (from KEYS[N+1]), '0' not to
-- ARGV[4]     N
-- ARGV[5]     at most this many starts (acquisitions) in any window of ARGV[6] ms; '' none
-- ARGV[7]     the owner's task id
-- ARGV[8]     '1' to look for the finish record (as acquire.lua's ARGV[5]); '' not to look
-- ARGV[9]     '1': KEYS[#KEYS] is the held index (includes/held_index.lua; one server only)
-- Returns     {slot, fence}: acquired the 1-based slot, with its fence (0 without fencing).
--               Also returned when a slot already holds this token: a resend after a lost
--               reply takes no second slot.
--             {0, wait}: a slot is free but ARGV[5] starts fell in the last ARGV[6] ms; the
--               next start is allowed in wait ms. Nothing changed (old starts are trimmed).
--             integer -1 (only with a finish record): it exists; nothing changed.
--             {0, wait} too when the live cap is reached with no slot held (wait: 1000 ms).
--             {0, ms, 1}: the live rule pauses the name for ms more (-1: until resumed).
--             string 'pttl|fence|acquired_at|pid|host|task_id': every slot is held (or as
--               many as the live cap allows); the
--               holder of the slot that frees first (pttl its remaining TTL in ms).
--             error NOTLOCK: a slot key holds a string that is not a lock value.
--- @include "lock_value"
--- @include "finish_records"
--- @include "take_lock"
--- @include "rate"
--- @include "held_index"
--- @include "live_rule"

local n, rate = tonumber(ARGV[4]), tonumber(ARGV[5])
local held = ARGV[9] == '1' and KEYS[#KEYS] or nil  -- held index
local cap_key = #KEYS > n + 3 + (held and 1 or 0) and KEYS[n + 4] or nil
if ARGV[8] ~= '' and is_finished(KEYS[n + 3], ARGV[7]) then
  return -1
end
local token = string.sub(ARGV[2], 1, 32)
local free, taken, held_at = nil, 0, nil
-- one MGET reads every slot (a GET per slot costs a call each: 415 us at N = 1,000)
local values = redis.call('MGET', unpack(KEYS, 1, n))
for i = 1, n do
  local v = values[i]
  if not v then
    free = free or i
  else
    if string.sub(v, 33, 33) ~= '|' then
      return redis.error_reply('NOTLOCK ' .. KEYS[i] .. ' holds a value that is not a lock')
    end
    if string.sub(v, 1, 32) == token then
      return {i, fence_of(v)}
    end
    taken, held_at = taken + 1, i
  end
end
local cap, paused = live_rule(cap_key)
if paused then
  return {0, paused, 1}
end
if free and cap then
  if taken >= cap then
    free = nil
  end
end
if free and rate then
  local window, starts, now = tonumber(ARGV[6]), KEYS[n + 2], now_ms()
  local wait = rate_wait(starts, rate, window, now)
  if wait > 0 then
    return {0, wait}
  end
  redis.call('ZADD', starts, now, token)
  redis.call('PEXPIRE', starts, window)
end
if free then
  redis.call('GET', KEYS[free])  -- MGET reads a key of another type as nil: GET refuses it
  index_held(held, KEYS[free], ARGV[1])  -- held index
  return {free, take_lock(KEYS[free], ARGV[2], ARGV[1], ARGV[3], KEYS[n + 1])}
end
local first, first_pttl
for i = 1, n do
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl >= 0 and (not first_pttl or pttl < first_pttl) then
    first, first_pttl = i, pttl
  end
end
if not first then
  if not held_at then  -- capped with no slot held: nothing to name
    return {0, 1000}
  end
  first, first_pttl = held_at, -1
end
return first_pttl .. '|' .. string.sub(redis.call('GET', KEYS[first]), 34)
