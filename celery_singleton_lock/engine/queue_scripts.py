"""Lua scripts of the two queue features of one server, each headed by its contract: the
queued markers of deduplication at enqueue (ENQUEUE, CLEAR_QUEUED) and the hand-off queue of
policy ``queue`` (ACQUIRE_OR_PARK, RELEASE_AND_HAND_OFF, HANDOFF_DUE, DROP_PARKED).

The lock value and its keys are described in :mod:`.scripts`, whose plain lease scripts
these extend. A Redlock quorum runs none of them (see its capabilities in :mod:`.redlock`).
"""

from __future__ import annotations

from celery_singleton_lock.engine.scripts import TOKEN_LENGTH
from celery_singleton_lock.engine.shared_keys import FUNCTIONS

ENQUEUE = """
-- Before a message is published (opt-in ``dedupe_on_enqueue``): is this lock name already
-- queued or running? One round trip; the caller publishes only on nil.
-- KEYS[1]  lock key
-- KEYS[2]  the lock's queued marker: a string holding the task id of the message queued
--          under this name, with its own TTL. ACQUIRE given ARGV[4] deletes it.
-- ARGV[1]  task id of the message about to be published (not empty)
-- ARGV[2]  marker TTL in ms
-- ARGV[3]  '0': a queued message or a running execution is a duplicate;
--          '1': a re-send of an existing message under its own task id (Celery's retry, a
--          lock retry): never reported as a duplicate, whatever is queued or running;
--          '2': only a queued message is a duplicate (the lock is not read)
-- Returns  nil: publish. The marker now holds ARGV[1] with TTL ARGV[2]: written when absent
--               (SET NX), its TTL replaced when it already held ARGV[1] (a retry is not
--               blocked by its own marker); left alone when it holds another id (ARGV[3]
--               '1').
--          string: the task id queued (the marker) or else running (the lock value's
--               task_id, when not empty and not ARGV[1]; ARGV[3] '0' only) under this name:
--               do not publish; nothing changed. A lock value without the lock shape is
--               ignored here (the worker's ACQUIRE reports it).
local q = redis.call('GET', KEYS[2])
if q == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return false
end
if q then
  if ARGV[3] == '1' then
    return false
  end
  return q
end
if ARGV[3] == '0' then
  local v = redis.call('GET', KEYS[1])
  if v and string.sub(v, 33, 33) == '|' then
    -- '<token>|<fence>|<acquired_at>|<pid>|<host>|<task_id>': the task id follows the 5th '|'
    local p = 33
    for _ = 1, 4 do
      p = p and string.find(v, '|', p + 1, true)
    end
    local holder = p and string.sub(v, p + 1)
    if holder and holder ~= '' and holder ~= ARGV[1] then
      return holder
    end
  end
end
redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2])
return false
"""

CLEAR_QUEUED = """
-- Remove a queued marker (see ENQUEUE): after a failed publish, a revoked message, or by hand.
-- KEYS[1]  the lock's queued marker
-- ARGV[1]  optional: a task id; then the marker is deleted only if it holds exactly that id
--          (a compare-and-delete: a newer message's marker is never removed)
-- Returns  1 deleted; 0 absent, or held by another task id: nothing changed.
if ARGV[1] and redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
return redis.call('DEL', KEYS[1])
"""

# -- hand-off queue (policy ``queue``) ------------------------------------------------------
#
# Per lock, beside the lock key (same hash tag):
#   P:{N}:parked           list of the task ids parked behind the lock, oldest first
#   P:{N}:parked-messages  hash: task id -> its parked message (opaque to the scripts, bytes)
# and one index per prefix, WITHOUT a hash tag (so: a single server or Sentinel, not a
# Cluster):
#   P:handoff-due          sorted set: lock name -> server time (ms) at which a sweeper should
#                          look at it (the holder's TTL runs out, or a reservation does)
# While the lock is handed to the oldest parked task id and that message is on its way, the
# lock holds a RESERVATION: a lock value whose token is HANDOFF_TOKEN (not hex, so no owner
# can have it), pid 0 and the reserved task id, with its own TTL. Only that task id takes it.

#: Token of a lock value that reserves the lock for the parked task id it names.
HANDOFF_TOKEN = "handoff-reserved-for-next-parked"
assert len(HANDOFF_TOKEN) == TOKEN_LENGTH

_HANDOFF_FUNCTIONS = (
    """
local HANDOFF_TOKEN = '"""
    + HANDOFF_TOKEN
    + """'
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- the task id of a lock value: what follows its 5th '|'
local function task_id_of(v)
  local p = 33
  for _ = 1, 4 do
    p = p and string.find(v, '|', p + 1, true)
  end
  return p and string.sub(v, p + 1) or ''
end
-- The lock is free: reserve it for the oldest parked task id for reserve_ms; returns that
-- id's parked message, or false (and drops the name from the index) when none is parked.
local function hand_off(lock, parked, messages, index, name, reserve_ms)
  local head = redis.call('LINDEX', parked, 0)
  if not head then
    redis.call('ZREM', index, name)
    return false
  end
  local now = now_ms()
  redis.call('SET', lock, HANDOFF_TOKEN .. '||' .. now .. '|0||' .. head, 'PX', reserve_ms)
  redis.call('ZADD', index, now + tonumber(reserve_ms), name)
  return redis.call('HGET', messages, head) or ''
end
"""
)

ACQUIRE_OR_PARK = (
    """
-- ACQUIRE for a task whose duplicates queue behind the holder: take the lock, or park this
-- task id's message in arrival order, in one round trip. Arrival order is kept: a free lock
-- with task ids parked before this one goes to the oldest of them, not to this caller.
-- KEYS[1]  lock key               KEYS[2]  shared fence counter key (as ACQUIRE's)
-- KEYS[3]  parked task ids (list) KEYS[4]  parked messages (hash)
-- KEYS[5]  hand-off index (sorted set, see above)
-- KEYS[6]  the lock's per-name fence counter of the previous version (as ACQUIRE's KEYS[3])
-- KEYS[7]  optional: the finish-record bucket prefix (as ACQUIRE's KEYS[4])
-- KEYS[8]  with KEYS[7]: the previous version's finish record (as ACQUIRE's KEYS[5])
-- ARGV[1]  ttl in ms
-- ARGV[2]  the lock value with an empty fence (as ACQUIRE)
-- ARGV[3]  '1' to hand out a fence, '0' not
-- ARGV[4]  the owner's task id (not empty)
-- ARGV[5]  this task id's message, stored if it is parked (opaque bytes)
-- ARGV[6]  the lock name (member of the index)
-- ARGV[7]  ms a reservation made here lives (see hand_off)
-- ARGV[8]  '1': an upgrade is under way (as ACQUIRE's ARGV[7])
-- ARGV[9]  with KEYS[7]: the finish records' lifetime in ms (as ACQUIRE's ARGV[5])
-- Returns  integer >= 0: acquired, as ACQUIRE (a reservation for this task id is taken over;
--                   this id leaves the parked list).
--          integer -1: the finish record exists; nothing changed.
--          string 'pttl|fence|acquired_at|pid|host|task_id': held by an execution of this
--                   very task id (a copy): not parked, nothing changed.
--          array {holder, position, handed}: parked (or already parked: kept where it was).
--                   holder is as the string above ('' when the lock was free and handed to
--                   an older parked id), position this id's 1-based place in the list,
--                   handed the message of the id the lock was just reserved for (the caller
--                   must publish it), or nil.
--          error NOTLOCK: the key holds a string that is not a lock value.
"""
    + _HANDOFF_FUNCTIONS
    + FUNCTIONS
    + """
local lock, parked, messages, index = KEYS[1], KEYS[3], KEYS[4], KEYS[5]
local id, name, reserve_ms = ARGV[4], ARGV[6], ARGV[7]
if KEYS[7] and is_finished(KEYS[7], ARGV[9], id, KEYS[8]) then
  return -1
end
local v = redis.call('GET', lock)
local take = false
local holder, handed = '', false
if v then
  if string.sub(v, 33, 33) ~= '|' then
    return redis.error_reply('NOTLOCK ' .. lock .. ' holds a value that is not a lock')
  end
  local token = string.sub(v, 1, 32)
  if token == string.sub(ARGV[2], 1, 32) then
    return fence_of(v)
  end
  local holder_id = task_id_of(v)
  if token == HANDOFF_TOKEN and holder_id == id then
    take = true
  else
    holder = redis.call('PTTL', lock) .. '|' .. string.sub(v, 34)
    if holder_id == id then
      return holder
    end
  end
else
  local head = redis.call('LINDEX', parked, 0)
  if not head or head == id then
    take = true
  else
    handed = hand_off(lock, parked, messages, index, name, reserve_ms)
  end
end
if take then
  if redis.call('LINDEX', parked, 0) == id then
    redis.call('LPOP', parked)
    redis.call('HDEL', messages, id)
  end
  if redis.call('LLEN', parked) == 0 then
    redis.call('ZREM', index, name)
  else
    redis.call('ZADD', index, now_ms() + tonumber(ARGV[1]), name)
  end
  return take_lock(lock, ARGV[2], ARGV[1], ARGV[3], KEYS[2], KEYS[6], ARGV[8])
end
local position
if redis.call('HSETNX', messages, id, ARGV[5]) == 1 then
  position = redis.call('RPUSH', parked, id)
else
  position = 0
  for i, parked_id in ipairs(redis.call('LRANGE', parked, 0, -1)) do
    if parked_id == id then
      position = i
      break
    end
  end
end
if not handed then
  local pttl = redis.call('PTTL', lock)
  if pttl < 0 then
    pttl = 0
  end
  redis.call('ZADD', index, 'NX', now_ms() + pttl, name)
end
return {holder, position, handed}
"""
)

RELEASE_AND_HAND_OFF = (
    """
-- RELEASE for a task whose duplicates queue: release (compare-and-delete), then reserve the
-- lock for the oldest parked task id. Also a sweeper's step (empty ARGV[1]): hand off a lock
-- that is free (its holder died and it expired, or a reservation ran out) and has parked ids.
-- KEYS[1]  lock key               KEYS[2]  parked task ids (list)
-- KEYS[3]  parked messages (hash) KEYS[4]  hand-off index
-- KEYS[5]  optional: the finish-record bucket prefix (as RELEASE's KEYS[2])
-- KEYS[6]  with KEYS[5]: the previous version's finish record (as RELEASE's KEYS[3])
-- ARGV[1]  token of the releasing owner, or '' for a sweeper
-- ARGV[2]  channel to publish the release on
-- ARGV[3]  the lock name (member of the index)
-- ARGV[4]  ms the reservation lives
-- ARGV[5..7]  with KEYS[5]: as RELEASE's ARGV[3..5] (record lifetime in ms, the owner's
--          task id, '1' while upgrading)
-- Returns  0: not ours (expired, taken over), or, for a sweeper, held: nothing released (a
--             sweeper re-schedules the name at the holder's TTL).
--          1: released (sweeper: found free), nothing parked.
--          string: released and reserved for the oldest parked id; its message, to publish.
"""
    + _HANDOFF_FUNCTIONS
    + FUNCTIONS
    + """
local lock, parked, messages, index = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local name, reserve_ms = ARGV[3], ARGV[4]
local v = redis.call('GET', lock)
if ARGV[1] == '' then
  if v then
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
else
  if not v or string.sub(v, 1, 32) ~= ARGV[1] then
    return 0
  end
  if KEYS[5] then
    record_release(KEYS[5], ARGV[5], ARGV[6], ARGV[7], KEYS[6], v)
  end
  redis.call('DEL', lock)
  redis.call('PUBLISH', ARGV[2], lock)
end
return hand_off(lock, parked, messages, index, name, reserve_ms) or 1
"""
)

HANDOFF_DUE = """
-- The lock names a sweeper should look at now (see RELEASE_AND_HAND_OFF with an empty token).
-- KEYS[1]  hand-off index
-- ARGV[1]  at most this many names
-- Returns  array of lock names whose time has come (server clock), oldest first.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[1])
"""

DROP_PARKED = (
    """
-- Drop one parked task id that will never take its lock (its message was revoked, expired,
-- or cannot be read), and hand the lock on at once if it was reserved for it: otherwise the
-- reservation would only run out after its TTL, and a sweeper would reserve the lock for
-- the same id again, for ever.
-- KEYS[1]  lock key               KEYS[2]  parked task ids (list)
-- KEYS[3]  parked messages (hash) KEYS[4]  hand-off index
-- ARGV[1]  the task id to drop (not empty)
-- ARGV[2]  the lock name (member of the index)
-- ARGV[3]  ms the reservation for the next parked id lives
-- Returns  0: neither parked nor reserved for: nothing changed (a lock HELD by that task id
--             is never touched).
--          1: dropped; the lock was not reserved for it, or nothing else is parked (then
--             the reservation is deleted and the lock is free).
--          string: dropped, and the lock reserved for the next parked id: its message, to
--             publish.
"""
    + _HANDOFF_FUNCTIONS
    + """
local lock, parked, messages, index = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, name, reserve_ms = ARGV[1], ARGV[2], ARGV[3]
local removed = redis.call('LREM', parked, 0, id) + redis.call('HDEL', messages, id)
local v = redis.call('GET', lock)
if v and string.sub(v, 1, 32) == HANDOFF_TOKEN and task_id_of(v) == id then
  redis.call('DEL', lock)
  return hand_off(lock, parked, messages, index, name, reserve_ms) or 1
end
if removed > 0 then
  return 1
end
return 0
"""
)
