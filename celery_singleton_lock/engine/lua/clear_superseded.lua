-- The displaced calls `task ids` were marked REVOKED: they are no longer left to mark (see
-- includes/displace.lua).
-- KEYS[1]  the lock's superseded calls left to mark (hash)
-- KEYS[2]  the prefix's index of calls left to mark (sorted set)
-- ARGV[1]  the lock name (member of the index)
-- ARGV[2]  ms from now at which a sweeper looks again at calls still left; '0': unchanged
--          (the worker that displaced them: a dead worker's calls keep their time)
-- ARGV[3..] the task ids marked
-- Returns  how many calls of the lock are still left to mark.
--- @include "now_ms"

if #ARGV > 2 then
  redis.call('HDEL', KEYS[1], unpack(ARGV, 3))
end
local left = redis.call('HLEN', KEYS[1])
if left == 0 then
  redis.call('ZREM', KEYS[2], ARGV[1])
elseif tonumber(ARGV[2]) > 0 then
  redis.call('ZADD', KEYS[2], 'XX', now_ms() + tonumber(ARGV[2]), ARGV[1])
end
return left
