-- Finish records: the task ids that ran to the end under a lock (acks_late). A record is a
-- member of one of many small sorted sets, the one keys.py picks from the task id (a
-- key of the script's KEYS), scored by the server ms at which the record expires. A write
-- drops its set's expired members and moves the set's expiry to its newest member's: a set
-- holds about throughput x lifetime / shards records (small enough for Redis's compact
-- encoding), nothing expires in a large block, and an idle set vanishes.
--- @include "now_ms"

-- Whether task id `id` has a finish record, still alive, in the set `key`.
local function is_finished(key, id)
  local expires = redis.call('ZSCORE', key, id)
  return expires ~= false and tonumber(expires) > now_ms()
end

-- Record in the set `key` that task id `id` finished, for `lifetime` ms.
local function record_finished(key, lifetime, id)
  local now = now_ms()
  redis.call('ZADD', key, string.format('%d', now + tonumber(lifetime)), id)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  redis.call('PEXPIREAT', key, redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
end
