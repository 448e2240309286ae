-- Drop one parked task id that will never take its lock (its message was revoked, expired,
-- or cannot be read), and hand the lock on at once if it was reserved for it: otherwise the
-- reservation would only run out after its TTL, and a sweeper would reserve the lock for
-- the same id again, for ever.
-- KEYS[1]  lock key               KEYS[2]  parked task ids (list)
-- KEYS[3]  parked messages (hash) KEYS[4]  hand-off index
-- ARGV[1]  the task id to drop (not empty)
-- ARGV[2]  the lock name (member of the index)
-- ARGV[3]  ms the reservation for the next parked id lives
-- Returns  0: neither parked nor reserved for: nothing changed (a lock HELD by that task id
--             is never touched).
--          1: dropped; the lock was not reserved for it, or nothing else is parked (then
--             the reservation is deleted and the lock is free).
--          string: dropped, and the lock reserved for the next parked id: its message, to
--             publish.
--- @include "lock_value"
--- @include "handoff"

local lock, parked, messages, index = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, name, reserve_ms = ARGV[1], ARGV[2], ARGV[3]
local removed = redis.call('LREM', parked, 0, id) + redis.call('HDEL', messages, id)
local v = redis.call('GET', lock)
if v and string.sub(v, 1, 32) == HANDOFF_TOKEN and task_id_of(v) == id then
  redis.call('DEL', lock)
  return hand_off(lock, parked, messages, index, name, reserve_ms) or 1
end
if removed > 0 then
  return 1
end
return 0
