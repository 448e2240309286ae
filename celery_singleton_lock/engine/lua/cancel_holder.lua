-- Ask the running holder of a lock to stop (policy restart): the newest call, waiting behind
-- it, flags the holder's task id. The holder's body reads the flag (its lock's `cancelled`),
-- and its worker's main process ends it once a grace has passed. (The flag's key:
-- engine/kinds/cancels.py.)
-- KEYS[1]  lock key (string; its value: includes/lock_value.lua)
-- KEYS[2]  the lock's cancel flag: a string holding the task id asked to stop
-- ARGV[1]  the task id of the call asking (not empty): it never flags itself
-- ARGV[2]  ms the flag lives (it names one task id, so a stale flag asks no later holder)
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
return holder
