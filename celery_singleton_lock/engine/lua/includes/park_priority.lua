-- Parking by priority (policy queue without lock_fair_by; with it, fair_queue.lua ranks the
-- calls of one fairness value the same way): the calls of a higher rank are
-- handed a slot first, and the calls of one rank in arrival order. The rank is the message's
-- priority as the caller reads it for its broker (higher: sooner; engine AcquireRequest's
-- `priority`), within [-MAX_RANK, MAX_RANK].
-- A call's score is (MAX_RANK - rank) * RANK_BAND + its arrival number; the arrival numbers
-- count up in the lock's rounds hash (field '', as park_fair's: deleted with the last parked
-- call), so one ZADD and one HINCRBY park a call, O(log n) as before.
--- @include "handoff"

local MAX_RANK = 255
-- 2^40 arrivals per rank band; (2 * MAX_RANK + 1) bands stay within a double's exact integers
local RANK_BAND = 1099511627776

-- `rank` as a whole number within [-MAX_RANK, MAX_RANK].
local function clamp_rank(rank)
  return math.max(-MAX_RANK, math.min(MAX_RANK, math.floor(rank)))
end

-- Park task id `id` with its `message` behind the calls of its `rank` and above (kept where it
-- is when already parked); returns its 1-based place.
local function park_ranked(parked, messages, rounds, id, message, rank)
  local place = redis.call('ZRANK', parked, id)
  if place then
    return place + 1
  end
  rank = clamp_rank(rank)
  local arrival = redis.call('HINCRBY', rounds, '', 1) % RANK_BAND
  redis.call('ZADD', parked, (MAX_RANK - rank) * RANK_BAND + arrival, id)
  redis.call('HSET', messages, id, message)
  return redis.call('ZRANK', parked, id) + 1
end
