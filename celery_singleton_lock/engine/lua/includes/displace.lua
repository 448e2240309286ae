-- Latest wins (policy replace, and lock_debounce): at most one call WAITS per lock (the
-- newest); the calls it displaces never run. Keys per lock, beside the others (same hash tag):
--   P:{N}:latest            hash: 'newest' (the task id of the call waiting, so that a reader
--                           can tell it from a parked call of policy queue); with a debounce,
--                           'first' (server ms of the burst's first call) and 'due' (server ms
--                           at which the waiting call may run); 'sent', the stamp of the
--                           newest call sent that waits, holds or held the lock (kept for the
--                           finish records' lifetime): a call sent before it is superseded;
--                           'rule', the live rule the waiting call read (its Cluster slot's
--                           copy), for the sweeper's hand-on to read its pause
--                           (hand_on_lock.lua)
--   P:{N}:superseded        sorted set: the task ids displaced by a newer call, scored by
--                           server ms; an acquire by one of them (a stale copy of its message)
--                           is refused. Kept for the finish records' lifetime, at most
--                           MAX_SUPERSEDED ids (the oldest are forgotten first).
--   P:{N}:superseded-left   hash: the displaced calls not yet marked REVOKED, task id ->
--                           message. The worker that displaced them marks them and clears them
--                           (clear_superseded.lua); one that dies first leaves them to a sweeper.
--   P:superseded-due        (one per prefix, as the hand-off index; one per slot on a Redis
--                           Cluster, P:superseded-due:{T}: engine/keys.py) lock names
--                           with calls left to mark, scored by when a sweeper should mark them:
--                           a grace after the displacement, for the worker to do it first.
-- Why the record is written by the script that displaces: the worker marks the displaced call
-- after the script returns, and a worker that died in between left it PENDING for ever.
--- @include "now_ms"

local MAX_SUPERSEDED = 1000

-- Record task `id` as superseded in `ids` (at `now`), forgetting those older than `keep_ms`
-- and all but the newest MAX_SUPERSEDED; and its `message` as left to mark in `left`, which
-- `index` says a sweeper marks `grace_ms` from now (an earlier look stays).
local function supersede(ids, left, index, name, id, message, now, keep_ms, grace_ms)
  redis.call('ZADD', ids, now, id)
  redis.call('ZREMRANGEBYSCORE', ids, '-inf', now - keep_ms)
  redis.call('ZREMRANGEBYRANK', ids, 0, -(MAX_SUPERSEDED + 1))
  redis.call('PEXPIRE', ids, keep_ms)
  redis.call('HSET', left, id, message)
  redis.call('PEXPIRE', left, keep_ms)
  redis.call('ZADD', index, 'NX', now + grace_ms, name)
end

-- Take out of the parked set every waiting call but `keep` and `reserved` (whose message is
-- on its way); returns their messages (each '<task id>\n...'), oldest first, each superseded.
local function displace(parked, messages, keep, reserved, ids, left, index, name, keep_ms,
                        grace_ms)
  local gone = {}
  local now = now_ms()
  for _, other in ipairs(redis.call('ZRANGE', parked, 0, -1)) do
    if other ~= keep and other ~= reserved then
      local message = redis.call('HGET', messages, other) or (other .. '\n')
      table.insert(gone, message)
      redis.call('ZREM', parked, other)
      redis.call('HDEL', messages, other)
      supersede(ids, left, index, name, other, message, now, keep_ms, grace_ms)
    end
  end
  return gone
end
