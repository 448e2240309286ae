-- Release a lock: a compare-and-delete by token, published to the lock's waiters.
-- KEYS[1]  lock key
-- KEYS[2]  optional: the finish-record set of the owner's task id (see
--          includes/finish_records.lua). Passed ONLY to record that the owner ran to the end,
--          for ARGV[3] ms. acquire.lua asked to look for it takes nothing while it lives.
-- ARGV[1]  token of the releasing owner (32 characters)
-- ARGV[2]  channel to publish the release on (waiters subscribe to it)
-- ARGV[3]  with KEYS[2]: how long the record lives, in ms
-- ARGV[4]  with KEYS[2]: the owner's task id
-- Returns  1 released; 0 not ours (expired, or taken over by another owner): nothing changed.
--- @include "release_lock"
--- @include "announce"

if #KEYS == 1 then
  if redis.call('GETRANGE', KEYS[1], '0', '31') ~= ARGV[1] then
    return 0
  end
  redis.call('DEL', KEYS[1])
  announce(ARGV[2], KEYS[1])
  return 1
end
return release_lock(KEYS[1], ARGV[1], ARGV[2], KEYS[2], ARGV[3], ARGV[4]) and 1 or 0
