-- The hand-off queue of policy queue (and latest wins). Per lock, beside the lock key (same
-- hash tag):
--   P:{N}:parked           sorted set: the task ids parked behind the lock, scored by arrival
--                          (1, 2, 3, ...: the newest's score + 1), so the oldest is first and
--                          finding, re-parking or dropping one id costs O(log n), not a walk
--   P:{N}:parked-messages  hash: task id -> its parked message (opaque to the scripts, bytes)
--   P:{N}:parked-rounds    hash: '' -> an arrival counter (park_priority.lua, fair_queue.lua)
--                          and, with lock_fair_by, fairness value -> the round of its newest
--                          parked call (fair_queue.lua)
-- and one index per prefix, WITHOUT a hash tag (so: a single server or Sentinel, not a
-- Cluster):
--   P:handoff-due          sorted set: lock name -> server time (ms) at which a sweeper should
--                          look at it (the holder's TTL runs out, or a reservation does)
-- While a free lock (or slot) is handed to the oldest parked task id and that message is on
-- its way, it holds a RESERVATION: a lock value whose token is HANDOFF_TOKEN (not hex, so no
-- owner can have it), pid 0 and the reserved task id, with its own TTL. Only that task id
-- takes it.
--- @include "now_ms"

local HANDOFF_TOKEN = 'handoff-reserved-for-next-parked'

-- Park task id `id` with its `message` behind the others in `parked` (kept where it is when
-- it is already parked); returns its 1-based place.
local function park(parked, messages, id, message)
  local rank = redis.call('ZRANK', parked, id)
  if rank then
    return rank + 1
  end
  local last = redis.call('ZRANGE', parked, -1, -1, 'WITHSCORES')
  redis.call('ZADD', parked, (tonumber(last[2]) or 0) + 1, id)
  redis.call('HSET', messages, id, message)
  return redis.call('ZCARD', parked)
end

-- Take task id `id` out of `parked` and its message out of `messages`; returns how many of
-- the two it was in (0, 1 or 2).
local function unpark(parked, messages, id)
  return redis.call('ZREM', parked, id) + redis.call('HDEL', messages, id)
end

-- The lock is free: reserve it for the oldest parked task id for reserve_ms; returns that
-- id's parked message, or false (and drops the name from the index) when none is parked.
local function hand_off(lock, parked, messages, index, name, reserve_ms)
  local head = redis.call('ZRANGE', parked, 0, 0)[1]
  if not head then
    redis.call('ZREM', index, name)
    return false
  end
  local now = now_ms()
  redis.call('SET', lock, HANDOFF_TOKEN .. '||' .. now .. '|0||' .. head, 'PX', reserve_ms)
  redis.call('ZADD', index, now + tonumber(reserve_ms), name)
  return redis.call('HGET', messages, head) or ''
end
