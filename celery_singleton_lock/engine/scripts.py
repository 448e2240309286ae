"""Lua scripts of the lock engine, each headed by its contract.

A lock is a Redis string with a TTL. Its value, fields separated by ``|``::

    <token>|<fence>|<acquired_at>|<pid>|<host>|<task_id>

    token        the holder's 128-bit random token, 32 hex characters (fixed width, so a
                 script compares ``string.sub(value, 1, 32)`` or ``GETRANGE key 0 31``);
                 the only proof of ownership
    fence        the fencing token given with this acquisition ('' when fencing is off)
    acquired_at  the holder's wall clock at acquisition, in milliseconds
    pid          the holder's process id
    host         the holder's host / worker node name, with '%' and '|' escaped as %25 and
                 %7C (only when present)
    task_id      what the holder runs (free text, may be empty); last, so it may contain '|'

The client sends the value whole (with an empty fence), so that without fencing acquiring is a
single ``SET key value NX PX ttl`` inside the script. A key at a lock's name whose value does not
have this shape (no ``|`` after 32 characters) was not written by this package: acquiring
raises a ``NOTLOCK`` error instead of reporting it as a holder.

The fence counter and the finish records are shared by many locks (see shared_keys.py); on a
cluster they are per hash slot, so every key ACQUIRE, RELEASE, RELEASE_ABANDONED, ENQUEUE and
CLEAR_QUEUED touch lives in one Redis Cluster slot (RENEW and RENEW_BY_OWNER take all the due
locks of a process at once, hence a single node or Sentinel). The counter never expires: a
counter that reset would hand out fences lower than ones a store has already seen.

All scripts are registered as redis-py ``Script`` objects and run with EVALSHA; on NOSCRIPT
the script is loaded (``SCRIPT LOAD``) and the call sent again.
"""

from __future__ import annotations

from celery_singleton_lock.engine.shared_keys import FUNCTIONS

#: Width of the token at the start of a lock value (hex of 128 random bits).
TOKEN_LENGTH = 32

ACQUIRE = (
    """
-- KEYS[1]  lock key (string)
-- With one key the script is a SET NX PX and reads no other key. Otherwise all six:
-- KEYS[2]  the shared fence counter (see shared_keys.py; a string that never expires)
-- KEYS[3]  the lock's per-name fence counter of the previous version (see next_fence)
-- KEYS[4]  the finish-record bucket prefix (see shared_keys.py)
-- KEYS[5]  this owner's per-name finish record of the previous version
-- KEYS[6]  the lock's queued marker (see ENQUEUE)
-- ARGV[1]  ttl in ms
-- ARGV[2]  the lock value with an empty fence: '<token>||<acquired_at>|<pid>|<host>|<task_id>'
-- ARGV[3]  '1' to hand out a fence, '0' not
-- ARGV[4]  the owner's task id ('' without ARGV[5] and ARGV[6])
-- ARGV[5]  the finish records' lifetime in ms: when this task id has one, nothing is taken
--          (this owner already ran to the end under this lock); '' not to look
-- ARGV[6]  '1': the queued marker is deleted if it holds exactly this task id, WHATEVER the
--          outcome below (acquired, held by someone else, finished): this message has
--          reached a worker, so it is no longer queued (a lock retry it sends writes a marker
--          again, see ENQUEUE);
--          '2': the same, except while the lock is held by another owner: a call that will
--          be sent again (policy retry) stays queued, so no duplicate is published between
--          this acquire and its re-send; '0' the marker is not read
-- ARGV[7]  '1': an upgrade is under way, keep the per-name fence counter written
-- Returns  integer >= 0: acquired; the fence (>= 1), or 0 without fencing. Also returned
--                   when the lock already holds this token: a resend after a lost reply is
--                   not a duplicate.
--          integer -1 (only with ARGV[5]): the finish record exists; nothing changed.
--          string 'pttl|fence|acquired_at|pid|host|task_id': held by someone else (pttl is the
--                   remaining TTL in ms, -1 without one; the holder's token is not returned).
--          error NOTLOCK: the key holds a string that is not a lock value (WRONGTYPE if it is
--                   not a string at all).
"""
    + FUNCTIONS
    + """
local v
if #KEYS == 1 then
  if redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ARGV[1]) then
    return 0
  end
  v = redis.call('GET', KEYS[1])
else
  local finished = ARGV[5] ~= '' and is_finished(KEYS[4], ARGV[5], ARGV[4], KEYS[5])
  local take = ARGV[6] == '1' or (ARGV[6] == '2' and finished)
  if ARGV[6] == '2' and not take then
    local held = redis.call('GET', KEYS[1])
    take = not held or string.sub(held, 1, 32) == string.sub(ARGV[2], 1, 32)
  end
  if take and redis.call('GET', KEYS[6]) == ARGV[4] then
    redis.call('DEL', KEYS[6])
  end
  if finished then
    return -1
  end
  v = redis.call('GET', KEYS[1])
  if not v then
    return take_lock(KEYS[1], ARGV[2], ARGV[1], ARGV[3], KEYS[2], KEYS[3], ARGV[7])
  end
end
if string.sub(v, 33, 33) ~= '|' then
  return redis.error_reply('NOTLOCK ' .. KEYS[1] .. ' holds a value that is not a lock')
end
if string.sub(v, 1, 32) == string.sub(ARGV[2], 1, 32) then
  return fence_of(v)
end
return redis.call('PTTL', KEYS[1]) .. '|' .. string.sub(v, 34)
"""
)

RELEASE = (
    """
-- KEYS[1]  lock key
-- KEYS[2]  optional: the finish-record bucket prefix (see shared_keys.py). Passed ONLY to
--          record that the owner ran to the end, for at least ARGV[3] ms (at most twice
--          that). ACQUIRE asked to look for it takes nothing while it lives.
-- KEYS[3]  with KEYS[2]: the owner's per-name finish record of the previous version, written
--          (the released value without its token, for ARGV[3] ms) only with ARGV[5] == '1'
-- ARGV[1]  token of the releasing owner (32 characters)
-- ARGV[2]  channel to publish the release on (waiters subscribe to it)
-- ARGV[3]  with KEYS[2]: how long the record lives, in ms
-- ARGV[4]  with KEYS[2]: the owner's task id
-- ARGV[5]  with KEYS[2]: '1' an upgrade is under way (see KEYS[3]), '0' not
-- Returns  1 released; 0 not ours (expired, or taken over by another owner): nothing changed.
"""
    + FUNCTIONS
    + """
if #KEYS == 1 then
  if redis.call('GETRANGE', KEYS[1], '0', '31') ~= ARGV[1] then
    return 0
  end
else
  local v = redis.call('GET', KEYS[1])
  if not v or string.sub(v, 1, 32) ~= ARGV[1] then
    return 0
  end
  record_release(KEYS[2], ARGV[3], ARGV[4], ARGV[5], KEYS[3], v)
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], KEYS[1])
return 1
"""
)

RENEW = """
-- KEYS[1..N]  lock keys
-- ARGV[1]     ttl in ms for every key without an override
-- ARGV[2]     the N tokens concatenated, 32 characters each, in KEYS order
-- ARGV[3..]   optional overrides, pairs: key index (1-based), ttl in ms for that key
-- Returns     the 1-based indices of the keys NOT renewed (gone, holding another token, or
--             not a string: left untouched); empty when every key was renewed. A renewed
--             key's TTL is REPLACED by its ttl, never added to.
local ttl, tokens, override = ARGV[1], ARGV[2], {}
for j = 3, #ARGV, 2 do
  override[tonumber(ARGV[j])] = ARGV[j + 1]
end
local lost, n = {}, 0
for i = 1, #KEYS do
  if redis.pcall('GETRANGE', KEYS[i], '0', '31') == string.sub(tokens, 32 * i - 31, 32 * i) then
    redis.call('PEXPIRE', KEYS[i], override[i] or ttl)
  else
    n = n + 1
    lost[n] = i
  end
end
return lost
"""

RELEASE_ABANDONED = """
-- For a supervisor whose child died holding a lock (it cannot know the child's token).
-- KEYS[1]  lock key
-- ARGV[1]  '<pid>|<host>|<task_id>' of the dead holder, host escaped as in the lock value
-- ARGV[2]  channel to publish the release on
-- Returns  1 released; 0 the lock is gone or held by another execution: nothing changed.
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 33, 33) ~= '|' then
  return 0
end
local fence_end = string.find(v, '|', 34, true)
local acquired_end = fence_end and string.find(v, '|', fence_end + 1, true)
if acquired_end and string.sub(v, acquired_end + 1) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], KEYS[1])
  return 1
end
return 0
"""

RENEW_BY_OWNER = """
-- For a supervisor keeping alive the locks of its children (it cannot know their tokens): a
-- child whose body holds the GIL in one long C call cannot renew its own lease.
-- KEYS[1..N]     lock keys
-- ARGV[1..N]     '<pid>|<host>|<task_id>' of the owner of each key, in KEYS order, host
--                escaped as in the lock value
-- ARGV[N+1..2N]  ttl in ms of each key, in KEYS order
-- Returns        the 1-based indices of the keys NOT renewed (gone, held by another owner,
--                or not a lock: left untouched); empty when every key was renewed. A renewed
--                key's TTL is REPLACED by its ttl, never added to; a key is never created.
local n, lost, k = #KEYS, {}, 0
for i = 1, n do
  local v = redis.pcall('GET', KEYS[i])
  local owned = false
  if type(v) == 'string' and string.sub(v, 33, 33) == '|' then
    local fence_end = string.find(v, '|', 34, true)
    local acquired_end = fence_end and string.find(v, '|', fence_end + 1, true)
    owned = acquired_end ~= nil and string.sub(v, acquired_end + 1) == ARGV[i]
  end
  if owned then
    redis.call('PEXPIRE', KEYS[i], ARGV[n + i])
  else
    k = k + 1
    lost[k] = i
  end
end
return lost
"""
