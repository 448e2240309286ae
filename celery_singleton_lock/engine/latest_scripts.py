"""Lua scripts of "latest wins" (policy ``replace``, and ``lock_debounce``), each headed by its
contract: ACQUIRE_OR_REPLACE and RELEASE_LATEST.

They share the keys of the hand-off queue of policy ``queue`` (:mod:`.queue_scripts`): the
parked list, the parked messages, the hand-off index and the reservation a release makes for
the next parked call, so the hand-off sweeper and ``HANDOFF_DUE``/``DROP_PARKED`` serve both.
What differs: at most one call WAITS per lock (the newest; a call whose reservation is on
its way is not waiting, it is about to run), and a debounced call is held until its due time
even when the lock is free. One more key per lock, beside the others (same hash tag):

    P:{N}:latest   hash: ``newest`` (the task id of the call waiting, so that a reader can
                   tell it from a parked call of policy ``queue``); with a debounce, ``first``
                   (server ms of the burst's first call) and ``due`` (server ms at which the
                   waiting call may run)
    P:{N}:superseded
                   sorted set: the task ids displaced by a newer call, scored by server ms;
                   an acquire by one of them (a stale copy of its message) is refused. Kept
                   for the finish records' lifetime, at most MAX_SUPERSEDED ids.
    P:{N}:superseded-left
                   hash: the displaced calls not yet marked REVOKED, task id -> message. The
                   worker that displaced them marks them and clears them (CLEAR_SUPERSEDED);
                   one that dies first leaves them to a sweeper.
    P:superseded-due
                   (one per prefix, no hash tag, as the hand-off index) lock names with calls
                   left to mark, scored by when a sweeper should mark them (HANDOFF_DUE reads
                   it): a grace after the displacement, for the worker to do it first.

Why the record is written by the script that displaces: the worker marks the displaced call
after the script returns, and a worker that died in between left it PENDING for ever.
"""

from __future__ import annotations

from celery_singleton_lock.engine.queue_scripts import _HANDOFF_FUNCTIONS
from celery_singleton_lock.engine.shared_keys import FUNCTIONS

#: Task ids remembered as superseded per lock, at most (the oldest are forgotten first).
MAX_SUPERSEDED = 1000

_DISPLACE = (
    """
-- Take out of the parked list every waiting call but `keep` and `reserved` (whose message is
-- on its way); returns their messages (each '<task id>\\n...'), oldest first. Each is
-- recorded as superseded (`ids`) and as left to mark (`left`); `index` says when a sweeper
-- marks those still left.
local function displace(parked, messages, keep, reserved, ids, left, index, name, keep_ms,
                        grace_ms)
  local gone = {}
  local now = now_ms()
  for _, other in ipairs(redis.call('LRANGE', parked, 0, -1)) do
    if other ~= keep and other ~= reserved then
      local message = redis.call('HGET', messages, other) or (other .. '\\n')
      table.insert(gone, message)
      redis.call('LREM', parked, 0, other)
      redis.call('HDEL', messages, other)
      redis.call('ZADD', ids, now, other)
      redis.call('HSET', left, other, message)
    end
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', ids, '-inf', now - keep_ms)
    redis.call('ZREMRANGEBYRANK', ids, 0, -"""
    + str(MAX_SUPERSEDED + 1)
    + """)
    redis.call('PEXPIRE', ids, keep_ms)
    redis.call('PEXPIRE', left, keep_ms)
    redis.call('ZADD', index, 'NX', now + grace_ms, name)  -- an earlier look stays
  end
  return gone
end
"""
)

ACQUIRE_OR_REPLACE = (
    """
-- ACQUIRE for a task whose newest duplicate wins: take the lock, or become the one call that
-- waits behind it, displacing the call that waited there, in one round trip.
-- KEYS[1]  lock key               KEYS[2]  shared fence counter key (as ACQUIRE's)
-- KEYS[3]  parked task ids (list) KEYS[4]  parked messages (hash)
-- KEYS[5]  hand-off index         KEYS[6]  the lock's latest-wins hash (see the module doc)
-- KEYS[7]  the lock's per-name fence counter of earlier builds (as ACQUIRE's KEYS[3])
-- KEYS[8]  the lock's superseded task ids (sorted set, see the module doc)
-- KEYS[9]  the lock's superseded calls left to mark (hash)
-- KEYS[10] the prefix's index of calls left to mark (sorted set)
-- KEYS[11] optional: the finish-record bucket prefix (as ACQUIRE's KEYS[4])
-- KEYS[12] with KEYS[11]: the earlier builds' finish record (as ACQUIRE's KEYS[5])
-- ARGV[1]  ttl in ms              ARGV[2]  the lock value with an empty fence (as ACQUIRE)
-- ARGV[3]  '1' to hand out a fence, '0' not
-- ARGV[4]  the owner's task id (not empty)
-- ARGV[5]  this task id's message, stored if it waits (opaque bytes)
-- ARGV[6]  the lock name (member of the index)
-- ARGV[7]  unused (ms a reservation lives: this script makes none)
-- ARGV[8]  debounce in ms; '0': none (a free lock is taken at once)
-- ARGV[9]  debounce max in ms (from the burst's first call); '0': none
-- ARGV[10] '1': an upgrade is under way (as ACQUIRE's ARGV[7])
-- ARGV[11] ms the finish records (with KEYS[11]) and the superseded records live
-- ARGV[12] ms after a displacement at which a sweeper marks the calls still left to mark
-- Returns  integer >= 0: acquired, as ACQUIRE: the lock was free with nothing waiting (no
--                   debounce), or reserved for this id (a call waiting behind it stays).
--          integer -1: the finish record exists; nothing changed.
--          integer -2: this task id was superseded (a stale copy); nothing changed.
--          string 'pttl|fence|acquired_at|pid|host|task_id': held by an execution of this
--                   very task id (a copy): nothing changed.
--          array {holder, position, displaced}: this call waits (or already waited: kept, no
--                   timer restarted). holder as the string above ('' when the lock is free:
--                   a debounce holds the call; or a call was left waiting by a holder that
--                   ended without handing on: this one takes its place and a sweeper hands
--                   it the lock at its next look), position its 1-based place (2 behind a call
--                   whose reservation is on its way), displaced the messages of the calls
--                   it took the place of (each '<task id>\\n<message>'), which will never run.
--          error NOTLOCK: the key holds a string that is not a lock value.
"""
    + _HANDOFF_FUNCTIONS
    + FUNCTIONS
    + _DISPLACE
    + """
local lock, parked, messages, index, burst = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, name = ARGV[4], ARGV[6]
local debounce, debounce_max = tonumber(ARGV[8]), tonumber(ARGV[9])
if KEYS[11] and is_finished(KEYS[11], ARGV[11], id, KEYS[12]) then
  return -1
end
if redis.call('ZSCORE', KEYS[8], id) then
  return -2
end
local v = redis.call('GET', lock)
local take, reserved, holder = false, false, ''
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
    if token == HANDOFF_TOKEN then
      reserved = holder_id
    elseif holder_id == id then
      return holder
    end
  end
elseif debounce == 0 and redis.call('LLEN', parked) == 0 then
  take = true
end
if take then
  redis.call('LREM', parked, 0, id)
  redis.call('HDEL', messages, id)
  if redis.call('LLEN', parked) == 0 then
    redis.call('ZREM', index, name)
    redis.call('DEL', burst)
  else  -- a newer call waits: a sweeper looks when this lease could run out, not before due
    redis.call('ZADD', index, 'GT', now_ms() + tonumber(ARGV[1]), name)
  end
  return take_lock(lock, ARGV[2], ARGV[1], ARGV[3], KEYS[2], KEYS[7], ARGV[10])
end
local position = redis.call('LPOS', parked, id)
if position then
  return {holder, position + 1, {}}
end
local gone = displace(parked, messages, id, reserved, KEYS[8], KEYS[9], KEYS[10], name,
                     tonumber(ARGV[11]), tonumber(ARGV[12]))
redis.call('HSET', messages, id, ARGV[5])
position = redis.call('RPUSH', parked, id)
local now = now_ms()
if debounce > 0 then
  local first = now
  if #gone > 0 then
    first = tonumber(redis.call('HGET', burst, 'first') or now)
  end
  local due = now + debounce
  if debounce_max > 0 and first + debounce_max < due then
    due = first + debounce_max
  end
  redis.call('HSET', burst, 'first', first, 'due', due, 'newest', id)
  redis.call('PEXPIRE', burst, due - now + 3600000)
  redis.call('ZADD', index, due, name)
else
  local pttl = redis.call('PTTL', lock)
  if pttl < 0 then
    pttl = 0
  end
  redis.call('HSET', burst, 'newest', id)
  redis.call('PEXPIRE', burst, pttl + 3600000)
  redis.call('ZADD', index, 'LT', now + pttl, name)  -- look no later than the holder's end
end
return {holder, position, gone}
"""
)

RELEASE_LATEST = (
    """
-- RELEASE for a task whose newest duplicate wins: release (compare-and-delete), then reserve
-- the lock for the call waiting behind it, unless that call's debounce runs on (the index
-- then holds its due time, and a sweeper hands it the lock then).
-- KEYS[1]  lock key               KEYS[2]  parked task ids (list)
-- KEYS[3]  parked messages (hash) KEYS[4]  hand-off index
-- KEYS[5]  the lock's debounce hash
-- KEYS[6]  optional: the finish-record bucket prefix (as RELEASE's KEYS[2])
-- KEYS[7]  with KEYS[6]: the earlier builds' finish record (as RELEASE's KEYS[3])
-- ARGV[1]  token of the releasing owner
-- ARGV[2]  channel to publish the release on
-- ARGV[3]  the lock name (member of the index)
-- ARGV[4]  ms the reservation lives
-- ARGV[5..7]  with KEYS[6]: as RELEASE's ARGV[3..5] (record lifetime in ms, the owner's
--          task id, '1' while upgrading)
-- Returns  0: not ours (expired, taken over): nothing released.
--          1: released; nothing waits, or the waiting call is not due yet.
--          string: released and reserved for the waiting call; its message, to publish.
"""
    + _HANDOFF_FUNCTIONS
    + FUNCTIONS
    + """
local lock, parked, messages, index, burst = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local name, reserve_ms = ARGV[3], ARGV[4]
local v = redis.call('GET', lock)
if not v or string.sub(v, 1, 32) ~= ARGV[1] then
  return 0
end
if KEYS[6] then
  record_release(KEYS[6], ARGV[5], ARGV[6], ARGV[7], KEYS[7], v)
end
redis.call('DEL', lock)
redis.call('PUBLISH', ARGV[2], lock)
local due = tonumber(redis.call('HGET', burst, 'due') or '0')
if due > now_ms() and redis.call('LLEN', parked) > 0 then
  redis.call('ZADD', index, due, name)
  return 1
end
return hand_off(lock, parked, messages, index, name, reserve_ms) or 1
"""
)

CLEAR_SUPERSEDED = """
-- The displaced calls `task ids` were marked REVOKED: they are no longer left to mark.
-- KEYS[1]  the lock's superseded calls left to mark (hash)
-- KEYS[2]  the prefix's index of calls left to mark (sorted set)
-- ARGV[1]  the lock name (member of the index)
-- ARGV[2]  ms from now at which a sweeper looks again at calls still left; '0': unchanged
--          (the worker that displaced them: a dead worker's calls keep their time)
-- ARGV[3..] the task ids marked
-- Returns  how many calls of the lock are still left to mark.
if #ARGV > 2 then
  redis.call('HDEL', KEYS[1], unpack(ARGV, 3))
end
local left = redis.call('HLEN', KEYS[1])
if left == 0 then
  redis.call('ZREM', KEYS[2], ARGV[1])
elseif tonumber(ARGV[2]) > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', KEYS[2], 'XX', now + tonumber(ARGV[2]), ARGV[1])
end
return left
"""
