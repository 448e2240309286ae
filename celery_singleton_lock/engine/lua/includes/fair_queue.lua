-- Fair parking (policy queue with lock_fair_by): a freed slot goes round robin across the
-- fairness values and, within one value, to its call of the highest rank (the message's
-- priority as the caller reads it for its broker, as park_priority.lua's), the oldest first
-- within one rank.
--
-- The parked set (handoff.lua) holds the TURNS: a call's score is its round * ROUND + its
-- arrival number (mod ROUND), where its round is the one after its value's newest parked
-- call, so every value has at most one turn per round and a round goes in arrival order.
-- WHICH call of a value takes the value's turn is chosen when the turn comes, from two more
-- keys beside the parked set (same hash tag, deleted with the last parked call):
--   P:{N}:parked-fair      sorted set, every score 0, read by lex order: one member per fair
--                          call not yet handed a slot, <value's length, 8 hex digits><value>
--                          <MAX_RANK - rank, 3 hex digits><arrival, 16 hex digits><task id>,
--                          so one value's calls are one range of it, the best first
--   P:{N}:parked-fair-ids  hash: task id -> its member there
-- When the turn of parked id X comes and Y is the best call of X's value, Y is handed the
-- slot and the two swap places in the parked set: the value keeps its turns (the round robin
-- across values is untouched) and X waits in Y's. So it goes when Y, parked, finds a slot
-- free and takes it itself (acquire_slot_or_park.lua), and when X finds one free: Y is
-- handed it, X parks on. Deciding at the turn, not at parking, keeps a park and a hand-off
-- O(log n): placing a late urgent call in its value's earliest turn at parking would move
-- every later call of the value back one turn. So the parked set's order (a call's place,
-- `locks show`) is the order of the turns; within one value the calls take them by rank.
--- @include "park_priority"
--- @include "slot_table"

local ROUND = 1e9

-- The member of a call in the fair order (see above).
local function fair_member(value, rank, arrival, id)
  return string.format('%08x', #value) .. value
         .. string.format('%03x%016x', MAX_RANK - clamp_rank(rank), arrival) .. id
end

-- Park task id `id` of queue `q` ({parked, messages, rounds, fair, fair_ids}) with its
-- `message`, fairly by `value` with `rank`: its turn in the round after its value's newest
-- parked call, and never before the round of the oldest call parked now (a value that was
-- idle joins the current round, not the first). Kept where it is when already parked.
-- Returns the 1-based place of its turn.
local function park_fair(q, id, message, value, rank)
  local place = redis.call('ZRANK', q.parked, id)
  if place then
    return place + 1
  end
  local head = redis.call('ZRANGE', q.parked, 0, 0, 'WITHSCORES')
  local current = head[2] and math.floor(tonumber(head[2]) / ROUND) or 0
  local round = math.max(tonumber(redis.call('HGET', q.rounds, value) or '0') + 1, current)
  local arrival = redis.call('HINCRBY', q.rounds, '', 1)
  redis.call('HSET', q.rounds, value, round)
  redis.call('ZADD', q.parked, round * ROUND + arrival % ROUND, id)
  redis.call('HSET', q.messages, id, message)
  local member = fair_member(value, rank, arrival, id)
  redis.call('ZADD', q.fair, 0, member)
  redis.call('HSET', q.fair_ids, id, member)
  return redis.call('ZRANK', q.parked, id) + 1
end

-- How many entries of the fair order one turn may find stale and drop (see fair_turn).
local STALE_MAX = 100

-- The task id that takes parked id `id`'s turn, and its member in the fair order: the best
-- call of `id`'s value not yet handed a slot; `id` itself and nil when `id` is not in the
-- fair order (parked without a value, or handed a slot once already: a reservation that ran
-- out is made again for the same id, in the turn it took). An entry whose call is no longer
-- parked, or holds a live reservation, is dropped on the way: a worker of a version without
-- the fair order took or handed that call and did not remove it (a rolling upgrade); each is
-- dropped once, so the walk stays O(log n) per call over time.
local function fair_turn(q, id, now)
  local member = redis.call('HGET', q.fair_ids, id)
  if not member then
    return id, nil
  end
  local value_end = 8 + tonumber(string.sub(member, 1, 8), 16)
  local value = string.sub(member, 1, value_end)
  for _ = 1, STALE_MAX do
    local best = redis.call('ZRANGEBYLEX', q.fair, '[' .. value, '(' .. value .. '\255',
                            'LIMIT', 0, 1)[1]
    if not best then
      break
    end
    local taker = string.sub(best, value_end + 20)
    if redis.call('ZSCORE', q.parked, taker) and not slot_by(q.S, 'r:' .. taker, now) then
      return taker, best
    end
    redis.call('ZREM', q.fair, best)
    if redis.call('HGET', q.fair_ids, taker) == best then
      redis.call('HDEL', q.fair_ids, taker)
    end
  end
  return id, nil
end

-- Hand parked id `id`'s turn to `taker` (fair_turn's, with its `member`): the taker leaves
-- the fair order and the two swap places in the parked set.
local function fair_take(q, id, taker, member)
  if not member then
    return
  end
  redis.call('ZREM', q.fair, member)
  redis.call('HDEL', q.fair_ids, taker)
  if taker ~= id then
    local turn = redis.call('ZSCORE', q.parked, id)
    redis.call('ZADD', q.parked, redis.call('ZSCORE', q.parked, taker), id, turn, taker)
  end
end

-- Take task id `id` out of the fair order (it took its slot, or was dropped).
local function fair_forget(q, id)
  local member = redis.call('HGET', q.fair_ids, id)
  if member then
    redis.call('ZREM', q.fair, member)
    redis.call('HDEL', q.fair_ids, id)
  end
end
