-- acquire.lua for a task whose duplicates queue behind the holder: take the lock, or park this
-- task id's message in arrival order, in one round trip. Arrival order is kept: a free lock
-- with task ids parked before this one goes to the oldest of them, not to this caller.
-- KEYS[1]  lock key               KEYS[2]  shared fence counter key (as acquire.lua's)
-- KEYS[3]  parked task ids (list) KEYS[4]  parked messages (hash)
-- KEYS[5]  hand-off index (sorted set, see includes/handoff.lua)
-- KEYS[6]  optional: the finish-record set to look in (as acquire.lua's KEYS[3])
-- ARGV[1]  ttl in ms
-- ARGV[2]  the lock value with an empty fence (as acquire.lua)
-- ARGV[3]  '1' to hand out a fence, '0' not
-- ARGV[4]  the owner's task id (not empty)
-- ARGV[5]  this task id's message, stored if it is parked (opaque bytes)
-- ARGV[6]  the lock name (member of the index)
-- ARGV[7]  ms a reservation made here lives (see hand_off)
-- Returns  integer >= 0: acquired, as acquire.lua (a reservation for this task id is taken
--                   over; this id leaves the parked list).
--          integer -1: the finish record exists; nothing changed.
--          string 'pttl|fence|acquired_at|pid|host|task_id': held by an execution of this
--                   very task id (a copy): not parked, nothing changed.
--          array {holder, position, handed}: parked (or already parked: kept where it was).
--                   holder is as the string above ('' when the lock was free and handed to
--                   an older parked id), position this id's 1-based place in the list,
--                   handed the message of the id the lock was just reserved for (the caller
--                   must publish it), or nil.
--          error NOTLOCK: the key holds a string that is not a lock value.
--- @include "lock_value"
--- @include "handoff"
--- @include "finish_records"
--- @include "take_lock"

local lock, parked, messages, index = KEYS[1], KEYS[3], KEYS[4], KEYS[5]
local id, name, reserve_ms = ARGV[4], ARGV[6], ARGV[7]
if KEYS[6] and is_finished(KEYS[6], id) then
  return -1
end
local v = redis.call('GET', lock)
local take = false
local holder, handed = '', false
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
    take = true
  else
    holder = redis.call('PTTL', lock) .. '|' .. string.sub(v, 34)
    if holder_id == id then
      return holder
    end
  end
else
  local head = redis.call('LINDEX', parked, 0)
  if not head or head == id then
    take = true
  else
    handed = hand_off(lock, parked, messages, index, name, reserve_ms)
  end
end
if take then
  if redis.call('LINDEX', parked, 0) == id then
    redis.call('LPOP', parked)
    redis.call('HDEL', messages, id)
  end
  if redis.call('LLEN', parked) == 0 then
    redis.call('ZREM', index, name)
  else
    redis.call('ZADD', index, now_ms() + tonumber(ARGV[1]), name)
  end
  return take_lock(lock, ARGV[2], ARGV[1], ARGV[3], KEYS[2])
end
local position = park(parked, messages, id, ARGV[5])
if not handed then
  local pttl = redis.call('PTTL', lock)
  if pttl < 0 then
    pttl = 0
  end
  redis.call('ZADD', index, 'NX', now_ms() + pttl, name)
end
return {holder, position, handed}
