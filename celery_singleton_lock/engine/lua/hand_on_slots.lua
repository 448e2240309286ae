-- The release of one slot of a task whose duplicates queue (ARGV[4] 'release'), a sweeper's
-- step (ARGV[4] 'sweep') or the drop of a parked id that will never run (ARGV[4] 'drop'),
-- each followed by the hand-off of the free slots to the parked ids without a reservation,
-- oldest first, as far as the rate allows (includes/slot_queue.lua); or (ARGV[4] 'sent') the
-- word that a handed id's message was published: its reservation, made short so that a death
-- before the publish stalls nobody for long, now lives its full time.
-- KEYS[1..N]  the N slot keys       KEYS[N+1]  the lock's starts (sorted set)
-- KEYS[N+2]   parked task ids       KEYS[N+3]  parked messages      KEYS[N+4]  hand-off index
-- KEYS[N+5]   the lock's rule       KEYS[N+6]  the lock's parked rounds (deleted with the last
--             parked call)
-- KEYS[N+7]   with ARGV[10] '1': the task's live rule (includes/live_rule.lua: a cap, see
--             includes/slot_queue.lua's capped, and a pause: no slot handed on meanwhile)
-- KEYS[N+7+c] optional ('release' only): the finish-record set (as release.lua's KEYS[2]); c
--             is 1 with the live cap, else 0
-- ARGV[1]     N   ARGV[2]  the rate's starts ('' none)   ARGV[3]  its window in ms
-- ARGV[4]     'release', 'sweep', 'drop' or 'sent'
-- ARGV[5]     'release': the releasing owner's token; 'drop': the task id to drop; 'sent': the
--             task id whose message was published
-- ARGV[6]     channel to publish a release on   ARGV[7]  the lock name (index member)
-- ARGV[8]     ms a reservation lives ('sent': ms it lives from now on)
-- ARGV[9]     'release': the cooldown in ms ('' none): the slot stays taken that long (as
--             release_into_cooldown.lua), and is handed on when it ends; nothing is
--             published then
-- ARGV[10]    '1' when KEYS[N+7] is the live cap; '' none
-- ARGV[11..12] with the finish-record set: as release.lua's ARGV[3..4]
-- The slots handed on are the first N, or fewer when the lock's rule (written by the newest
-- parked call) names fewer: a limit lowered while calls are parked (a callable lock_limit)
-- frees no slot above it, and its releases hand on none.
-- Returns     {done, handed...}: done 1 when released ('release': 0 if the token held no
--             slot: nothing released), dropped ('drop': 0 if the id was neither parked nor
--             reserved for), swept, or 'sent' (0 if no slot is reserved for the id: it took
--             its slot already, or its reservation ran out); then the messages of the ids
--             just handed a slot, to publish. 'drop' hands at most one slot (the sweeper does
--             the rest), 'sent' none.
--             error NOTLOCK: a slot key holds a string that is not a lock value.
--- @include "slot_queue"
--- @include "finish_records"
--- @include "cooldown"
--- @include "announce"
--- @include "live_rule"

local n, mode = tonumber(ARGV[1]), ARGV[4]
local c = ARGV[10] == '1' and 1 or 0
local q = {starts = KEYS[n + 1], parked = KEYS[n + 2], messages = KEYS[n + 3],
           index = KEYS[n + 4], rule = KEYS[n + 5], rounds = KEYS[n + 6], name = ARGV[7],
           reserve = tonumber(ARGV[8]), rate = tonumber(ARGV[2]), window = tonumber(ARGV[3]),
           cap = nil, paused = nil}
q.cap, q.paused = live_rule(c == 1 and KEYS[n + 7] or nil)
local done, max = 1, n
if mode == 'release' then
  local slot
  for i = 1, n do
    if redis.call('GETRANGE', KEYS[i], '0', '31') == ARGV[5] then
      slot = i
      break
    end
  end
  if not slot then
    return {0}
  end
  local v = redis.call('GET', KEYS[slot])
  if KEYS[n + 7 + c] then
    record_finished(KEYS[n + 7 + c], ARGV[11], ARGV[12])
  end
  if ARGV[9] ~= '' then
    cool_down(KEYS[slot], v, ARGV[9])
  else
    redis.call('DEL', KEYS[slot])
    announce(ARGV[6], KEYS[slot])
  end
elseif mode == 'drop' then
  local id = ARGV[5]
  done = math.min(1, unpark(q.parked, q.messages, id))
  for i = 1, n do
    local v = redis.call('GET', KEYS[i])
    if v and string.sub(v, 1, 32) == HANDOFF_TOKEN and task_id_of(v) == id then
      redis.call('DEL', KEYS[i])
      redis.call('ZREM', q.starts, 'r:' .. id)
      done = 1
    end
  end
  max = 1
elseif mode == 'sent' then
  local id = ARGV[5]
  done = 0
  for i = 1, n do
    local v = redis.call('GET', KEYS[i])
    if v and string.sub(v, 1, 32) == HANDOFF_TOKEN and task_id_of(v) == id then
      redis.call('PEXPIRE', KEYS[i], q.reserve)
      if q.rate then  -- its start counts at the latest it can now come (slot_queue.lua)
        redis.call('ZADD', q.starts, 'XX', now_ms() + q.reserve, 'r:' .. id)
        redis.call('PEXPIRE', q.starts, q.window + q.reserve)
      end
      done = 1
    end
  end
  max = 0
end
local rule = redis.call('GET', q.rule)
if rule then
  n = math.min(n, tonumber(string.match(rule, '^(%d+)|')) or n)
end
local now = now_ms()
local free, reserved = survey(n, nil, nil)
free = capped(q, n, free)
local handed = hand_slots(n, q, free, reserved, now, max, nil)
schedule(n, q, now)
local reply = {done}
for _, message in ipairs(handed) do
  reply[#reply + 1] = message
end
return reply
