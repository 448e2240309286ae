-- release.lua for a task whose newest duplicate wins: release (compare-and-delete), then
-- reserve the lock for the call waiting behind it, unless that call's debounce runs on (the
-- index then holds its due time, and a sweeper hands it the lock then).
-- KEYS[1]  lock key               KEYS[2]  parked task ids (sorted set)
-- KEYS[3]  parked messages (hash) KEYS[4]  hand-off index
-- KEYS[5]  the lock's debounce hash
-- KEYS[6]  with ARGV[5] '1': the held index (includes/held_index.lua; one server only, left
--          out on a Redis Cluster)
-- KEYS[#KEYS] with ARGV[6..7]: the finish-record set (as release.lua's)
-- ARGV[1]  token of the releasing owner
-- ARGV[2]  channel to publish the release on
-- ARGV[3]  the lock name (member of the index)
-- ARGV[4]  ms the reservation lives
-- ARGV[5]  '1' when KEYS[6] is the held index; '' none
-- ARGV[6..7]  with the finish-record set: as release.lua's ARGV[3..4] (record lifetime in ms,
--          the owner's task id)
-- Returns  0: not ours (expired, taken over): nothing released.
--          1: released; nothing waits.
--          2: released; the waiting call is not due yet (its debounce runs on): the hand-off
--             index names the lock at its due time (slot_sweep.py's summary is marked).
--          string: released and reserved for the waiting call; its message, to publish.
--- @include "handoff"
--- @include "release_lock"
--- @include "held_index"

local lock, parked, messages, index, burst = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local name, reserve_ms = ARGV[3], ARGV[4]
local held = ARGV[5] == '1' and KEYS[6] or nil  -- held index
local records = ARGV[7] and KEYS[#KEYS] or nil
if not release_lock(lock, ARGV[1], ARGV[2], records, ARGV[6], ARGV[7]) then
  return 0
end
unindex_held(held, lock)  -- held index
local due = tonumber(redis.call('HGET', burst, 'due') or '0')
if due > now_ms() and redis.call('ZCARD', parked) > 0 then
  redis.call('ZADD', index, due, name)
  return 2
end
local handed = hand_off(lock, parked, messages, index, name, reserve_ms)
if not handed then
  return 1
end
index_held(held, lock, reserve_ms)  -- held index: the reservation
return handed
