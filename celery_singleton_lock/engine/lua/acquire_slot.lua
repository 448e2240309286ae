-- Take one of the N slots of a lock (lock_limit), as far as the rate allows (lock_rate), on
-- the slot table of includes/slot_table.lua: O(log n) whatever N (no slot is read one by one).
-- KEYS[1..2]  the lock's slot table: slots, slot-data
-- KEYS[3]     the shared fence counter (see includes/take_lock.lua)
-- KEYS[4]     the lock's body starts (sorted set: token scored by the server's clock in ms,
--             see includes/rate.lua), used with ARGV[5] only
-- KEYS[5]     the finish-record set of the owner's task id (as acquire.lua's KEYS[3]), used
--             with ARGV[8] only: when the record lives, nothing is taken
-- KEYS[6]     optional: the task's live rule (includes/live_rule.lua: a cap, at most that
--             many slots taken at once whatever N, and a pause)
-- KEYS[#KEYS] with ARGV[9] '1': the held index (includes/held_index.lua; one server only):
--             the slot table's key written there when this acquire makes the table (scored
--             by its lease's end)
-- ARGV[1]     ttl in ms
-- ARGV[2]     the lock value with an empty fence: '<token>||<acquired_at>|<pid>|<host>|<task_id>'
-- ARGV[3]     '1' to hand out a fence (from KEYS[3]), '0' not to
-- ARGV[4]     N
-- ARGV[5]     at most this many starts (acquisitions) in any window of ARGV[6] ms; '' none
-- ARGV[7]     the owner's task id
-- ARGV[8]     '1' to look for the finish record (as acquire.lua's ARGV[5]); '' not to look
-- ARGV[9]     '1': KEYS[#KEYS] is the held index (includes/held_index.lua; one server only)
-- Returns     {slot, fence}: acquired the 1-based slot (the smallest free number), with its
--               fence (0 without fencing). Also returned when a slot already holds this
--               token: a resend after a lost reply takes no second slot.
--             {0, wait}: a slot is free but ARGV[5] starts fell in the last ARGV[6] ms; the
--               next start is allowed in wait ms. Nothing changed (old starts are trimmed).
--             integer -1 (only with a finish record): it exists; nothing changed.
--             {0, wait} too when the live rule's cap is reached with no slot held (wait: 1000 ms).
--             {0, ms, 1}: the live rule pauses the name for ms more (-1: until resumed).
--             string 'pttl|fence|acquired_at|pid|host|task_id': every slot is held (or as
--               many as the live rule's cap allows); the holder of the slot that frees first (pttl
--               its remaining ms).
--- @include "slot_table"
--- @include "finish_records"
--- @include "take_lock"
--- @include "rate"
--- @include "live_rule"

local n, rate = tonumber(ARGV[4]), tonumber(ARGV[5])
local held = ARGV[9] == '1' and KEYS[#KEYS] or nil  -- held index
local cap_key = #KEYS > 5 + (held and 1 or 0) and KEYS[6] or nil
if ARGV[8] ~= '' and is_finished(KEYS[5], ARGV[7]) then
  return -1
end
local S, now = slot_keys(1, held), now_ms()
local token = string.sub(ARGV[2], 1, 32)
local k, there = slot_find(S, token)
local mine, v = slot_named(S, token, k, now)
if mine then
  return {tonumber(mine), fence_of(v)}
end
local cap, paused = live_rule(cap_key)
if paused then
  return {0, paused, 1}
end
-- no table: every slot free, and slot 1 the smallest number (slot_put_first writes it)
local taken = there and slots_taken(S, now) or 0
local free = taken < n
if cap and taken >= cap then
  free = false
end
local slot = free and (there and slot_number(S, n, now) or '1')
if slot and rate then
  local wait = rate_wait(KEYS[4], rate, tonumber(ARGV[6]), now)
  if wait > 0 then
    return {0, wait}
  end
  redis.call('ZADD', KEYS[4], now, string.sub(ARGV[2], 1, 32))
  redis.call('PEXPIRE', KEYS[4], ARGV[6])
end
if slot then
  local value, fence = fenced(ARGV[2], ARGV[3], KEYS[3])
  if there then
    -- the table's held-index entry, written when it was made, stays while it lives, and its
    -- score is read by no one (includes/held_index.lua): not written again per slot
    slot_put(slot_keys(1, nil), slot, value, now, tonumber(ARGV[1]), nil)
  else
    slot_put_first(S, value, now, tonumber(ARGV[1]))
  end
  return {tonumber(slot), fence}
end
local first, pttl = slot_first(S, now)
if not first then  -- capped with no slot held: nothing to name
  return {0, 1000}
end
return pttl .. '|' .. string.sub(redis.call('HGET', S.data, 'v' .. first), 34)
