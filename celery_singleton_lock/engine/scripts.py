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

The fence counter is a separate string key sharing the lock's hash tag, so every key ACQUIRE,
RELEASE, RELEASE_ABANDONED, ENQUEUE and CLEAR_QUEUED touch lives in one Redis Cluster slot
(RENEW and RENEW_BY_OWNER take all the due locks of a process at once, hence a single node or
Sentinel). The counter
never expires: a counter that reset would hand out fences lower than ones a store has already
seen.

All scripts are registered as redis-py ``Script`` objects and run with EVALSHA; on NOSCRIPT
the script is loaded (``SCRIPT LOAD``) and the call sent again.
"""

from __future__ import annotations

#: Width of the token at the start of a lock value (hex of 128 random bits).
TOKEN_LENGTH = 32

ACQUIRE = """
-- KEYS[1]  lock key (string)
-- KEYS[2]  optional: fence counter key (string, never expires). With one key the script
--          neither reads nor writes a counter.
-- KEYS[3]  optional: the finish record of this owner (see RELEASE). When it exists, nothing
--          is taken: this owner already ran to the end under this lock.
-- KEYS[#KEYS] with ARGV[4] only: the lock's queued marker (see ENQUEUE); then KEYS[3] is the
--          finish record only when there are 4 keys.
-- ARGV[1]  ttl in ms
-- ARGV[2]  the lock value with an empty fence: '<token>||<acquired_at>|<pid>|<host>|<task_id>'
-- ARGV[3]  optional, with KEYS[2]: '0' to take the lock without handing out a fence
-- ARGV[4]  optional, with KEYS[2] and ARGV[3]: the owner's task id. The queued marker is
--          deleted if it holds exactly this id, WHATEVER the outcome below (acquired, held
--          by someone else, finished): this message has reached a worker, so it is no longer
--          queued (a lock retry it sends writes a marker again, see ENQUEUE).
-- Returns  integer >= 0: acquired; the fence (>= 1), or 0 without fencing. Also returned
--                   when the lock already holds this token: a resend after a lost reply is
--                   not a duplicate.
--          integer -1 (only with KEYS[3]): the finish record exists; nothing changed.
--          string 'pttl|fence|acquired_at|pid|host|task_id': held by someone else (pttl is the
--                   remaining TTL in ms, -1 without one; the holder's token is not returned).
--          error NOTLOCK: the key holds a string that is not a lock value (WRONGTYPE if it is
--                   not a string at all).
local v
if #KEYS == 1 then
  if redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ARGV[1]) then
    return 0
  end
  v = redis.call('GET', KEYS[1])
else
  local finished = KEYS[3]
  if ARGV[4] then
    local queued = KEYS[#KEYS]
    if #KEYS == 3 then
      finished = nil
    end
    if redis.call('GET', queued) == ARGV[4] then
      redis.call('DEL', queued)
    end
  end
  if finished and redis.call('EXISTS', finished) == 1 then
    return -1
  end
  v = redis.call('GET', KEYS[1])
  if not v then
    if ARGV[3] == '0' then
      redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[1])
      return 0
    end
    local fence = redis.call('INCR', KEYS[2])
    redis.call('SET', KEYS[1],
               string.sub(ARGV[2], 1, 33) .. string.format('%d', fence) .. string.sub(ARGV[2], 34),
               'PX', ARGV[1])
    return fence
  end
end
if string.sub(v, 33, 33) ~= '|' then
  return redis.error_reply('NOTLOCK ' .. KEYS[1] .. ' holds a value that is not a lock')
end
if string.sub(v, 1, 32) == string.sub(ARGV[2], 1, 32) then
  return tonumber(string.match(v, '^%d+', 34)) or 0
end
return redis.call('PTTL', KEYS[1]) .. '|' .. string.sub(v, 34)
"""

RELEASE = """
-- KEYS[1]  lock key
-- KEYS[2]  optional: the owner's finish record (see keys.py). Passed ONLY to record that the
--          owner ran to the end: set to the released value without its token, for ARGV[3] ms.
--          ACQUIRE given that record takes nothing while it lives.
-- ARGV[1]  token of the releasing owner (32 characters)
-- ARGV[2]  channel to publish the release on (waiters subscribe to it)
-- ARGV[3]  with KEYS[2]: how long the record lives, in ms
-- Returns  1 released; 0 not ours (expired, or taken over by another owner): nothing changed.
if #KEYS == 1 then
  if redis.call('GETRANGE', KEYS[1], '0', '31') ~= ARGV[1] then
    return 0
  end
else
  local v = redis.call('GET', KEYS[1])
  if not v or string.sub(v, 1, 32) ~= ARGV[1] then
    return 0
  end
  redis.call('SET', KEYS[2], string.sub(v, 34), 'PX', ARGV[3])
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], KEYS[1])
return 1
"""

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
