-- Finish records: the task ids that ran to the end under a lock (acks_late), shared by every
-- lock of a prefix (per hash slot on a cluster, see shared_keys.py). Under the bucket prefix
-- `base`, records living `width` ms go to the set '<base>:<width>:<b>' of bucket
-- b = server ms // width, which expires at the end of bucket b + 1: a record lives at least
-- `width` ms and at most twice that. The set's name is made here from the server's clock, so
-- it is not among the script's KEYS (only its prefix is).
--- @include "now_ms"

-- Whether task id `id` has a finish record (in the bucket of now or the one before).
local function is_finished(base, width, id)
  local b = math.floor(now_ms() / tonumber(width))
  local sets = base .. ':' .. width .. ':'
  return redis.call('SISMEMBER', sets .. string.format('%d', b), id) == 1
    or redis.call('SISMEMBER', sets .. string.format('%d', b - 1), id) == 1
end

-- Record that task id `id` finished, for at least `width` ms (at most twice that).
local function record_finished(base, width, id)
  local w = tonumber(width)
  local b = math.floor(now_ms() / w)
  local set = base .. ':' .. width .. ':' .. string.format('%d', b)
  redis.call('SADD', set, id)
  redis.call('PEXPIREAT', set, string.format('%d', (b + 2) * w))
end
