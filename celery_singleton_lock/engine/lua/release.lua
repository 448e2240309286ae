-- Release a lock: a compare-and-delete by token, published to the lock's waiters.
-- KEYS[1]  lock key
-- KEYS[2]  optional: the held index (includes/held_index.lua; one server only, left out on a
--          Redis Cluster)
-- KEYS[#KEYS] with ARGV[3..4]: the finish-record set of the owner's task id (see
--          includes/finish_records.lua). Passed ONLY to record that the owner ran to the end,
--          for ARGV[3] ms. acquire.lua asked to look for it takes nothing while it lives.
-- ARGV[1]  token of the releasing owner (32 characters)
-- ARGV[2]  channel to publish the release on (waiters subscribe to it)
-- ARGV[3]  with the finish-record set: how long the record lives, in ms
-- ARGV[4]  with the finish-record set: the owner's task id
-- Returns  1 released; 0 not ours (expired, or taken over by another owner): nothing changed.
--- @include "release_lock"
--- @include "announce"
--- @include "held_index"

local records = ARGV[4] and KEYS[#KEYS]
local held = #KEYS == (records and 3 or 2) and KEYS[2]  -- held index: false without it
if not records then
  if redis.call('GETRANGE', KEYS[1], '0', '31') ~= ARGV[1] then
    return 0
  end
  redis.call('DEL', KEYS[1])
  unindex_held(held, KEYS[1])  -- held index
  announce(ARGV[2], KEYS[1])
  return 1
end
if not release_lock(KEYS[1], ARGV[1], ARGV[2], records, ARGV[3], ARGV[4]) then
  return 0
end
unindex_held(held, KEYS[1])  -- held index
return 1
