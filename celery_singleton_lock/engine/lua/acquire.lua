-- Take a lock (the mutex): a SET NX PX, with a fence, a finish-record check and the queued
-- marker's deletion when asked.
-- KEYS[1]  lock key (string; its value: includes/lock_value.lua)
-- With one key (a Redis Cluster), two (KEYS[2] the held index, or a Cluster's live rule:
-- ARGV[3] below) or three (KEYS[3] the live rule) the script is a SET NX PX and reads no
-- other key but the rule. Otherwise four, six with the indexes (one server) and seven with
-- the live rule; five on a Redis Cluster with the live rule (KEYS[5] the rule's copy in the
-- lock's slot, no index):
-- KEYS[2]  the shared fence counter (see includes/take_lock.lua)
-- KEYS[3]  the finish-record set of the owner's task id (includes/finish_records.lua; its
--          name: keys.py)
-- KEYS[4]  the lock's queued marker (see enqueue.lua)
-- KEYS[2] of the short form, KEYS[5] of the long: the held index (includes/held_index.lua),
--          on one server only (left out on a Redis Cluster)
-- KEYS[6]  with KEYS[5]: the marker index (see enqueue.lua): a deleted marker's entry goes too
-- KEYS[3] of the short form (KEYS[2] with ARGV[3] '1'), KEYS[7] of the long (KEYS[5] of
--          five, a Cluster's): the task's (or group's) live rule (includes/live_rule.lua, on
--          a Cluster its copy in the lock's slot): while it pauses the lock's name, nothing
--          is taken
-- ARGV[1]  ttl in ms
-- ARGV[2]  the lock value with an empty fence: '<token>||<acquired_at>|<pid>|<host>|<task_id>'
-- ARGV[3]  '1' to hand out a fence, '0' not; in the short form: '1' when KEYS[2] is the live
--          rule (a Cluster's: no held index), absent otherwise
-- ARGV[4]  the owner's task id ('' without ARGV[5] and ARGV[6])
-- ARGV[5]  '1': when this task id has a live finish record, nothing is taken (this owner
--          already ran to the end under this lock); '' not to look
-- ARGV[6]  '1': the queued marker is deleted if it holds exactly this task id, WHATEVER the
--          outcome below (acquired, held by someone else, finished): this message has
--          reached a worker, so it is no longer queued (a lock retry it sends writes a marker
--          again, see enqueue.lua);
--          '2': the same, except while the lock is held by another owner: a call that will
--          be sent again (policy retry) stays queued, so no duplicate is published between
--          this acquire and its re-send; '0' the marker is not read
-- Returns  integer >= 0: acquired; the fence (>= 1), or 0 without fencing. Also returned
--                   when the lock already holds this token: a resend after a lost reply is
--                   not a duplicate.
--          integer -1 (only with ARGV[5]): the finish record exists; nothing changed.
--          {-3, ms}: the live rule pauses the name for ms more (-1: until resumed); nothing
--                   taken (the queued marker as when held by someone else). Not for a token
--                   that holds the lock already (a resend): its fence, as above.
--          string 'pttl|fence|acquired_at|pid|host|task_id': held by someone else (pttl is the
--                   remaining TTL in ms, -1 without one; the holder's token is not returned).
--          error NOTLOCK: the key holds a string that is not a lock value (WRONGTYPE if it is
--                   not a string at all).
--- @include "lock_value"
--- @include "finish_records"
--- @include "take_lock"
--- @include "held_index"
--- @include "live_rule"

local v
if #KEYS <= 3 then
  local held_index, rule = KEYS[2], KEYS[3]
  if ARGV[3] == '1' then
    held_index, rule = nil, KEYS[2]
  end
  local _, paused = live_rule(rule)
  if not paused and redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ARGV[1]) then
    index_held(held_index, KEYS[1], ARGV[1])
    return 0
  end
  v = redis.call('GET', KEYS[1])
  if paused and not (v and string.sub(v, 1, 32) == string.sub(ARGV[2], 1, 32)) then
    return {-3, paused}  -- a resend of a call that took it before the pause is not refused
  end
else
  local finished = ARGV[5] ~= '' and is_finished(KEYS[3], ARGV[4])
  local held_index, marker_index, rule = KEYS[5], KEYS[6], KEYS[7]
  if #KEYS == 5 then  -- a Cluster's, with the rule: no index
    held_index, rule = nil, KEYS[5]
  end
  local _, paused = live_rule(rule)
  local take = ARGV[6] == '1' or (ARGV[6] == '2' and finished)
  if ARGV[6] == '2' and not take and not paused then
    local held = redis.call('GET', KEYS[1])
    take = not held or string.sub(held, 1, 32) == string.sub(ARGV[2], 1, 32)
  end
  if take and redis.call('GET', KEYS[4]) == ARGV[4] then
    redis.call('DEL', KEYS[4])
    unindex_held(marker_index, KEYS[4])
  end
  if finished then
    return -1
  end
  v = redis.call('GET', KEYS[1])
  if paused and not (v and string.sub(v, 1, 32) == string.sub(ARGV[2], 1, 32)) then
    return {-3, paused}
  end
  if not v then
    index_held(held_index, KEYS[1], ARGV[1])
    return take_lock(KEYS[1], ARGV[2], ARGV[1], ARGV[3], KEYS[2])
  end
end
if string.sub(v, 33, 33) ~= '|' then
  return redis.error_reply('NOTLOCK ' .. KEYS[1] .. ' holds a value that is not a lock')
end
if string.sub(v, 1, 32) == string.sub(ARGV[2], 1, 32) then
  return fence_of(v)
end
return redis.call('PTTL', KEYS[1]) .. '|' .. string.sub(v, 34)
