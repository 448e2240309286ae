-- hand_on_slots.lua for a lock whose calls wait behind its lock key (latest wins: one call
-- waits, acquire_or_replace.lua; no slot rule is written for it): a sweeper's step (ARGV[1]
-- 'sweep'), the drop of a parked id that will never run ('drop'), or the word that a handed
-- id's message was published ('sent'), on the lock key itself (includes/handoff.lua).
-- KEYS[1]  lock key         KEYS[2]  parked task ids    KEYS[3]  parked messages
-- KEYS[4]  hand-off index (on a Cluster the one of the lock key's slot)
-- KEYS[5]  the lock's parked rounds (deleted with the last parked id)
-- KEYS[6]  the lock's latest-wins hash (includes/displace.lua): its 'due' (a debounce) and
--          the live rule its waiting call read ('rule', which the caller passes as KEYS[7])
-- KEYS[7]  with ARGV[5] '1': the task's live rule (includes/live_rule.lua; on a Redis Cluster
--          its copy in the lock's slot): while it pauses the task, the free lock is handed to
--          nobody; the waiting call is looked at again when the pause ends (until resumed:
--          after a reservation's life, and at once on a resume, pause.lua), as
--          acquire_or_replace.lua schedules it
-- ARGV[1]  'sweep', 'drop' or 'sent'
-- ARGV[2]  'drop': the task id to drop; 'sent': the task id whose message was published
-- ARGV[3]  the lock name (index member)
-- ARGV[4]  ms a reservation lives ('sent': ms it lives from now on)
-- ARGV[5]  '1' when KEYS[7] is the live rule; '' none
-- Returns  {done, handed...}: as hand_on_slots.lua's (at most one message handed: the lock is
--          reserved for the oldest parked id when it is free, no pause holds it and its
--          debounce is due).
--- @include "handoff"
--- @include "lock_value"
--- @include "live_rule"

local lock, parked, messages, index, rounds = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local burst = KEYS[6]
local mode, id, name, reserve = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local v = redis.call('GET', lock)
local reserved = v and string.sub(v, 1, 32) == HANDOFF_TOKEN and task_id_of(v) or nil
local done = 1
if mode == 'sent' then
  if reserved ~= id then
    return {0}
  end
  redis.call('PEXPIRE', lock, reserve)
  redis.call('ZADD', index, now_ms() + reserve, name)
  return {1}
end
if mode == 'drop' then
  done = math.min(1, unpark(parked, messages, id))
  if reserved == id then
    redis.call('DEL', lock)
    v, done = nil, 1
  end
end
if redis.call('ZCARD', parked) == 0 then
  redis.call('ZREM', index, name)
  redis.call('DEL', rounds)
  return {done}
end
if not v then
  -- a pause, or a debounce not yet due (a resume makes every parked lock of its family due at
  -- once): nothing handed on; looked at again when the later of the two ends
  local _, paused = live_rule(ARGV[5] == '1' and KEYS[7] or nil)
  local now = now_ms()
  local due = tonumber(redis.call('HGET', burst, 'due') or '0')
  if paused then
    local ends = now + (paused > 0 and paused or reserve)
    due = math.max(due, ends)
    -- the waiting call's record outlives a pause until resumed (as parking made it outlive
    -- its holder's lease)
    if redis.call('PTTL', burst) < ends - now + 3600000 then
      redis.call('PEXPIRE', burst, ends - now + 3600000)
    end
  end
  if due > now then
    redis.call('ZADD', index, due, name)
    return {done}
  end
  local message = hand_off(lock, parked, messages, index, name, reserve)
  return message and {done, message} or {done}
end
redis.call('ZADD', index, now_ms() + math.max(redis.call('PTTL', lock), 0), name)
return {done}
