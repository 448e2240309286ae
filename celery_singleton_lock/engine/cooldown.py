"""A cooldown after each run (``lock_cooldown``): the release leaves the key taken for a while.

The release compares the owner's token, as RELEASE does, then writes the key again with the
token :data:`COOLDOWN_TOKEN` and the pid field ``cooldown`` for the cooldown's length: an
acquire finds it held (by the run that just ended, its remaining TTL the cooldown left), no
one can release or renew it (no owner has that token, no process that pid), and it frees
itself when the cooldown ends. Nothing is published: a waiter re-checks at the holder's TTL.
The same works on a slot key (:mod:`.slots`). The release itself: :mod:`.kinds.cooldown`.
"""

from __future__ import annotations

from celery_singleton_lock.engine.shared_keys import FUNCTIONS

#: The token of a key in its cooldown: 32 characters, never a real token (those are hex).
COOLDOWN_TOKEN = "cooldown" * 4
#: The pid field of a key in its cooldown.
COOLDOWN_PID = "cooldown"

RELEASE_INTO_COOLDOWN = f"""
-- KEYS[1]  lock (or slot) key
-- KEYS[2]  optional: the finish-record bucket prefix (as RELEASE's KEYS[2])
-- KEYS[3]  with KEYS[2]: the earlier builds' finish record (as RELEASE's KEYS[3])
-- ARGV[1]  token of the releasing owner (32 characters)
-- ARGV[2]  the cooldown in ms
-- ARGV[3..5]  with KEYS[2]: as RELEASE's ARGV[3..5] (record lifetime in ms, the owner's
--          task id, '1' while upgrading)
-- Returns  1 released into its cooldown: KEYS[1] holds the released value with the token
--          '{COOLDOWN_TOKEN}' and the pid '{COOLDOWN_PID}', expiring in ARGV[2] ms;
--          0 not ours (expired, or taken over): nothing changed.
"""
RELEASE_INTO_COOLDOWN += FUNCTIONS
RELEASE_INTO_COOLDOWN += f"""
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 32) ~= ARGV[1] then
  return 0
end
if KEYS[2] then
  record_release(KEYS[2], ARGV[3], ARGV[4], ARGV[5], KEYS[3], v)
end
local fence_end = string.find(v, '|', 34, true)
local acquired_end = string.find(v, '|', fence_end + 1, true)
local pid_end = string.find(v, '|', acquired_end + 1, true)
redis.call('SET', KEYS[1],
           '{COOLDOWN_TOKEN}' .. string.sub(v, 33, acquired_end) .. '{COOLDOWN_PID}'
           .. string.sub(v, pid_end), 'PX', ARGV[2])
return 1
"""
