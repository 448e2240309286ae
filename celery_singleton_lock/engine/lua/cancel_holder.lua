-- Ask the running holder of a lock to stop (policy restart): the newest call, waiting behind
-- it, flags the holder's task id. The holder's body reads the flag (its lock's `cancelled`),
-- and its worker's main process ends it once a grace has passed; the holder's task id is also
-- published on the lock's cancel channel, so that a body whose process listens there learns
-- it at once (engine/cancel_watch.py), the flag staying for a reader that missed it. (The
-- flag's key and the channel: engine/kinds/cancels.py.)
-- KEYS[1]  lock key (string; its value: includes/lock_value.lua)
-- KEYS[2]  the lock's cancel flag: a string holding the task id asked to stop
-- ARGV[1]  the task id of the call asking (not empty): it never flags itself
-- ARGV[2]  ms the flag lives (it names one task id, so a stale flag asks no later holder)
-- ARGV[3]  the lock's cancel channel (same hash tag as the lock: on a Cluster, a shard
--          channel of the lock's slot)
-- ARGV[4]  the command that publishes there: 'PUBLISH', or 'SPUBLISH' on a Redis Cluster
--          (sharded pub/sub, Redis >= 7: the message stays in the lock's shard)
-- Returns  string: the task id of the holder now asked to stop (the flag written, or
--                  written again).
--          nil: nothing flagged: the lock is free, reserved for a waiting call, in a
--                  cooldown (tokens that are not hex: no running owner), held by ARGV[1]
--                  itself, or its value names no task.
--          error NOTLOCK: the key holds a string that is not a lock value.
--- @include "lock_value"

local v = redis.call('GET', KEYS[1])
if not v then
  return false
end
if string.sub(v, 33, 33) ~= '|' then
  return redis.error_reply('NOTLOCK ' .. KEYS[1] .. ' holds a value that is not a lock')
end
if not string.find(string.sub(v, 1, 32), '^%x+$') then
  return false
end
local holder = task_id_of(v)
if holder == '' or holder == ARGV[1] then
  return false
end
redis.call('SET', KEYS[2], holder, 'PX', ARGV[2])
redis.call(ARGV[4], ARGV[3], holder)
return holder
