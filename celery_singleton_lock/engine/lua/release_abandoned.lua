-- Release the lock of a dead holder, by its owner fields: for a supervisor whose child died
-- holding a lock (it cannot know the child's token).
-- KEYS[1]  lock key
-- KEYS[2]  optional: the held index (includes/held_index.lua; one server only)
-- ARGV[1]  '<pid>|<host>|<task_id>' of the dead holder, host escaped as in the lock value
-- ARGV[2]  channel to publish the release on
-- Returns  1 released; 0 the lock is gone or held by another execution: nothing changed.
--- @include "lock_value"
--- @include "announce"
--- @include "held_index"

local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 33, 33) ~= '|' then
  return 0
end
if owner_of(v) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  unindex_held(KEYS[2], KEYS[1])  -- held index
  announce(ARGV[2], KEYS[1])
  return 1
end
return 0
