-- acquire.lua for a task whose newest duplicate wins (policy replace, lock_debounce): take the
-- lock, or become the one call that waits behind it, displacing the call that waited there,
-- in one round trip. (The keys of latest wins: includes/displace.lua.)
-- KEYS[1]  lock key               KEYS[2]  shared fence counter key (as acquire.lua's)
-- KEYS[3]  parked task ids (sorted set)  KEYS[4]  parked messages (hash)
-- KEYS[5]  hand-off index         KEYS[6]  the lock's latest-wins hash
-- KEYS[7]  the lock's superseded task ids (sorted set)
-- KEYS[8]  the lock's superseded calls left to mark (hash)
-- KEYS[9]  the prefix's index of calls left to mark (sorted set)
-- KEYS[10] with ARGV[13] '1': the task's live rule (includes/live_rule.lua; on a Redis Cluster
--          its copy in the lock's slot, shared_keys.py's rule_of): while it pauses
--          the task, no call takes the lock, not even one it was reserved for (the reservation
--          is given up; a newer waiting call then supersedes this one), and the waiting call
--          is looked at again when the pause ends (a resume makes it due at once, pause.lua);
--          a call that waits names it in the latest-wins hash ('rule'), so that a sweeper's
--          hand-on reads the same pause (hand_on_lock.lua)
-- KEYS[10+c] with ARGV[14] '1': the finish-record set to look in (as acquire.lua's KEYS[3]);
--          c is 1 with the live rule, else 0
-- KEYS[#KEYS] with ARGV[15] '1': the held index (includes/held_index.lua; one server only,
--          left out on a Redis Cluster)
-- ARGV[1]  ttl in ms              ARGV[2]  the lock value with an empty fence (as acquire.lua)
-- ARGV[3]  '1' to hand out a fence, '0' not
-- ARGV[4]  the owner's task id (not empty)
-- ARGV[5]  this task id's message, stored if it waits (opaque bytes)
-- ARGV[6]  the lock name (member of the index)
-- ARGV[7]  unused (ms a reservation lives: this script makes none)
-- ARGV[8]  debounce in ms; '0': none (a free lock is taken at once)
-- ARGV[9]  debounce max in ms (from the burst's first call); '0': none
-- ARGV[10] ms the superseded records live
-- ARGV[11] ms after a displacement at which a sweeper marks the calls still left to mark
-- ARGV[12] when this call was sent (its stamp, compared as a string: 16 digits of epoch
--          microseconds, then a tie-breaker); '' for none (no order by sending kept)
-- ARGV[13] '1' when KEYS[10] is the live rule; '' none
-- ARGV[14] '1' when KEYS[10+c] is the finish-record set; '' none (no finish record looked for)
-- ARGV[15] '1' when KEYS[#KEYS] is the held index; '' none
-- (Each optional key has its flag: on a Cluster, with no held index, a key found by its place
-- would be another's.)
-- Returns  integer >= 0: acquired, as acquire.lua: the lock was free with nothing waiting (no
--                   debounce), or reserved for this id (a call waiting behind it stays).
--          integer -1: the finish record exists; nothing changed.
--          integer -2: this task id was superseded (a stale copy), or it was sent before a
--                   call that waits, holds or held the lock: now recorded as superseded and
--                   left to mark, as a displaced call.
--          string 'pttl|fence|acquired_at|pid|host|task_id': held by an execution of this
--                   very task id (a copy): nothing changed.
--          array {holder, position, displaced, paused}: this call waits (or already waited:
--                   kept, no timer restarted). holder as the string above ('' when the lock is
--                   free: a debounce or a pause holds the call; or a call was left waiting by
--                   a holder that ended without handing on: this one takes its place and a
--                   sweeper hands it the lock at its next look), position its 1-based place (2
--                   behind a call whose reservation is on its way), displaced the messages of
--                   the calls it took the place of (each '<task id>\n<message>'), which will
--                   never run; paused the ms the live rule's pause still lasts (-1: until
--                   resumed; 0: not paused).
--          error NOTLOCK: the key holds a string that is not a lock value.
--- @include "lock_value"
--- @include "handoff"
--- @include "finish_records"
--- @include "take_lock"
--- @include "displace"
--- @include "held_index"
--- @include "live_rule"

local lock, parked, messages, index, burst = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, name, sent = ARGV[4], ARGV[6], ARGV[12]
local keep_ms = tonumber(ARGV[10])
local debounce, debounce_max = tonumber(ARGV[8]), tonumber(ARGV[9])
local c = ARGV[13] == '1' and 1 or 0
local _, paused = live_rule(c == 1 and KEYS[10] or nil)
local records = ARGV[14] == '1' and KEYS[10 + c] or nil
local held = ARGV[15] == '1' and KEYS[#KEYS] or nil  -- held index
if records and is_finished(records, id) then
  return -1
end
if redis.call('ZSCORE', KEYS[7], id) then
  return -2
end
local v = redis.call('GET', lock)
local take, reserved, holder = false, false, ''
if v then
  if string.sub(v, 33, 33) ~= '|' then
    return redis.error_reply('NOTLOCK ' .. lock .. ' holds a value that is not a lock')
  end
  local token = string.sub(v, 1, 32)
  if token == string.sub(ARGV[2], 1, 32) then
    return fence_of(v)
  end
  local holder_id = task_id_of(v)
  if token == HANDOFF_TOKEN and holder_id == id then
    take, reserved = true, id  -- it was the newest sent when it was handed the lock
  else
    holder = redis.call('PTTL', lock) .. '|' .. string.sub(v, 34)
    if token == HANDOFF_TOKEN then
      reserved = holder_id
    elseif holder_id == id then
      return holder
    end
  end
elseif debounce == 0 and redis.call('ZCARD', parked) == 0 then
  take = true
end
-- Calls are ordered by when they were sent, not by when they get here: one sent before the
-- newest that waits, holds or held the lock (its stamp is kept as 'sent') never waits or runs.
local newest_sent = redis.call('HGET', burst, 'sent')
if sent ~= '' and newest_sent and sent < newest_sent then
  if reserved ~= id then  -- left to mark as a displaced call is: never PENDING for ever
    supersede(KEYS[7], KEYS[8], KEYS[9], name, id, ARGV[5], now_ms(), keep_ms, tonumber(ARGV[11]))
    return -2
  end
elseif sent ~= '' then
  redis.call('HSET', burst, 'sent', sent)
end
if take and paused then
  -- paused: not even the lock reserved for this call is taken. The reservation is given up
  -- (so no holder is shown), and this call waits on, unless a newer call waits behind it: the
  -- newest is the one that runs when the pause ends, so this one is superseded (as displaced)
  take = false
  if reserved == id then
    redis.call('DEL', lock)
    unindex_held(held, lock)  -- held index
    reserved, holder = false, ''
    if redis.call('ZCARD', parked) > 1 then
      unpark(parked, messages, id)
      supersede(KEYS[7], KEYS[8], KEYS[9], name, id, ARGV[5], now_ms(), keep_ms,
                tonumber(ARGV[11]))
      return -2
    end
  end
end
if take then
  unpark(parked, messages, id)
  if redis.call('ZCARD', parked) == 0 then
    redis.call('ZREM', index, name)
    redis.call('HDEL', burst, 'newest', 'first', 'due', 'rule')
    redis.call('PEXPIRE', burst, keep_ms)  -- only 'sent' is left
  else  -- a newer call waits: a sweeper looks when this lease could run out, not before due
    redis.call('ZADD', index, 'GT', now_ms() + tonumber(ARGV[1]), name)
  end
  index_held(held, lock, ARGV[1])  -- held index
  return take_lock(lock, ARGV[2], ARGV[1], ARGV[3], KEYS[2])
end
-- while paused, a sweeper looks at the waiting call when the pause ends (until resumed: after
-- a reservation's life, and at once on a resume, pause.lua), not before its debounce is due;
-- the rule is named for that sweeper, which hands the lock on only once no pause holds it
local function look_after_pause(now)
  if c == 1 then
    redis.call('HSET', burst, 'rule', KEYS[10])
  else
    redis.call('HDEL', burst, 'rule')
  end
  if paused then
    local ends = now + (paused > 0 and paused or tonumber(ARGV[7]))
    redis.call('ZADD', index, 'GT', ends, name)  -- never earlier than a debounce's due
  end
end
local position = redis.call('ZRANK', parked, id)
if position then
  look_after_pause(now_ms())
  return {holder, position + 1, {}, paused or 0}
end
local gone = displace(parked, messages, id, reserved, KEYS[7], KEYS[8], KEYS[9], name,
                     tonumber(ARGV[10]), tonumber(ARGV[11]))
position = park(parked, messages, id, ARGV[5])
local now = now_ms()
if debounce > 0 then
  local first = now
  if #gone > 0 then
    first = tonumber(redis.call('HGET', burst, 'first') or now)
  end
  local due = now + debounce
  if debounce_max > 0 and first + debounce_max < due then
    due = first + debounce_max
  end
  redis.call('HSET', burst, 'first', first, 'due', due, 'newest', id)
  redis.call('PEXPIRE', burst, math.max(due - now + 3600000, keep_ms))
  redis.call('ZADD', index, due, name)
else
  local pttl = redis.call('PTTL', lock)
  if pttl < 0 then
    pttl = 0
  end
  redis.call('HSET', burst, 'newest', id)
  redis.call('PEXPIRE', burst, math.max(pttl + 3600000, keep_ms))
  redis.call('ZADD', index, 'LT', now + pttl, name)  -- look no later than the holder's end
end
look_after_pause(now)
return {holder, position, gone, paused or 0}
