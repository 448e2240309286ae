-- The hand-off queue of policy queue (and latest wins). Per lock, beside the lock key (same
-- hash tag):
--   P:{N}:parked           list of the task ids parked behind the lock, oldest first
--   P:{N}:parked-messages  hash: task id -> its parked message (opaque to the scripts, bytes)
-- and one index per prefix, WITHOUT a hash tag (so: a single server or Sentinel, not a
-- Cluster):
--   P:handoff-due          sorted set: lock name -> server time (ms) at which a sweeper should
--                          look at it (the holder's TTL runs out, or a reservation does)
-- While the lock is handed to the oldest parked task id and that message is on its way, the
-- lock holds a RESERVATION: a lock value whose token is HANDOFF_TOKEN (not hex, so no owner
-- can have it), pid 0 and the reserved task id, with its own TTL. Only that task id takes it.
--- @include "now_ms"

local HANDOFF_TOKEN = 'handoff-reserved-for-next-parked'

-- The lock is free: reserve it for the oldest parked task id for reserve_ms; returns that
-- id's parked message, or false (and drops the name from the index) when none is parked.
local function hand_off(lock, parked, messages, index, name, reserve_ms)
  local head = redis.call('LINDEX', parked, 0)
  if not head then
    redis.call('ZREM', index, name)
    return false
  end
  local now = now_ms()
  redis.call('SET', lock, HANDOFF_TOKEN .. '||' .. now .. '|0||' .. head, 'PX', reserve_ms)
  redis.call('ZADD', index, now + tonumber(reserve_ms), name)
  return redis.call('HGET', messages, head) or ''
end

-- Park task id `id` with its `message` at the end of the list `parked` (kept where it is when
-- it is already parked); returns its 1-based place.
local function park(parked, messages, id, message)
  if redis.call('HSETNX', messages, id, message) == 1 then
    return redis.call('RPUSH', parked, id)
  end
  for i, parked_id in ipairs(redis.call('LRANGE', parked, 0, -1)) do
    if parked_id == id then
      return i
    end
  end
  return 0
end
