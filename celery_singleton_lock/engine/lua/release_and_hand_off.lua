-- release.lua for a task whose duplicates queue: release (compare-and-delete), then reserve the
-- lock for the oldest parked task id. Also a sweeper's step (empty ARGV[1]): hand off a lock
-- that is free (its holder died and it expired, or a reservation ran out) and has parked ids.
-- KEYS[1]  lock key               KEYS[2]  parked task ids (list)
-- KEYS[3]  parked messages (hash) KEYS[4]  hand-off index
-- KEYS[5]  optional: the finish-record set (as release.lua's KEYS[2])
-- ARGV[1]  token of the releasing owner, or '' for a sweeper
-- ARGV[2]  channel to publish the release on
-- ARGV[3]  the lock name (member of the index)
-- ARGV[4]  ms the reservation lives
-- ARGV[5..6]  with KEYS[5]: as release.lua's ARGV[3..4] (record lifetime in ms, the owner's
--          task id)
-- Returns  0: not ours (expired, taken over), or, for a sweeper, held: nothing released (a
--             sweeper re-schedules the name at the holder's TTL).
--          1: released (sweeper: found free), nothing parked.
--          string: released and reserved for the oldest parked id; its message, to publish.
--- @include "handoff"
--- @include "release_lock"

local lock, parked, messages, index = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local name, reserve_ms = ARGV[3], ARGV[4]
if ARGV[1] == '' then
  if redis.call('GET', lock) then
    local pttl = redis.call('PTTL', lock)
    if pttl < 0 then
      pttl = tonumber(reserve_ms)
    end
    if redis.call('EXISTS', parked) == 1 then
      redis.call('ZADD', index, now_ms() + pttl, name)
    else
      redis.call('ZREM', index, name)
    end
    return 0
  end
elseif not release_lock(lock, ARGV[1], ARGV[2], KEYS[5], ARGV[5], ARGV[6]) then
  return 0
end
return hand_off(lock, parked, messages, index, name, reserve_ms) or 1
