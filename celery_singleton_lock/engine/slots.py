"""At most N holders per lock name (``lock_limit``): N slots, each an ordinary lock key.

Slot 1 of a lock is the lock key itself (``P:{N}``); slot ``k`` > 1 is ``P:{N}:slot:k``. Every
slot holds a lock value of the one shape of :mod:`.scripts` (token, fence, owner fields), so
everything that works on one lock key by its name works on a slot unchanged: the batched
RENEW of the pool's renewer (it sends each lease's own key), the owner-checked RELEASE, and
the key's TTL after ``kill -9``. A slot is released only by its token, so a slot freed by one
holder is never released by another. The slots share the lock's hash tag (one Cluster slot)
and its fence counter (a fence strictly increasing per lock name, whichever slot is taken).

A limit of 1 never comes here unless a rate is asked for (``lock_rate``: the same script
counts the starts of the lock in a sorted set, ``P:{N}:starts``, by the server's clock); else
it is the mutex of :mod:`.locker`, same script, same keys.
"""

from __future__ import annotations

from typing import Any, Optional

from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.shared_keys import FUNCTIONS

ACQUIRE_SLOT = (
    """
-- KEYS[1..N]  the N slot keys of one lock, slot 1 first (KEYS[1] is the lock key itself)
-- KEYS[N+1]   the shared fence counter (see shared_keys.py; string, never expires)
-- KEYS[N+2]   the lock's per-name fence counter of earlier builds (see next_fence)
-- KEYS[N+3]   the lock's body starts (sorted set: token scored by the server's clock in ms,
--             see lock_rate), used with ARGV[5] only
-- KEYS[N+4]   the finish-record bucket prefix, KEYS[N+5] the earlier builds' finish record
--             of this owner, both used with ARGV[8] only: when the record exists, nothing is
--             taken
-- ARGV[1]     ttl in ms
-- ARGV[2]     the lock value with an empty fence: '<token>||<acquired_at>|<pid>|<host>|<task_id>'
-- ARGV[3]     '1' to hand out a fence (from KEYS[N+1]), '0' not to
-- ARGV[4]     N
-- ARGV[5]     at most this many starts (acquisitions) in any window of ARGV[6] ms; '' none
-- ARGV[7]     the owner's task id
-- ARGV[8]     the finish records' lifetime in ms (as ACQUIRE's ARGV[5]); '' not to look
-- ARGV[9]     '1': an upgrade is under way (as ACQUIRE's ARGV[7])
-- Returns     {slot, fence}: acquired the 1-based slot, with its fence (0 without fencing).
--               Also returned when a slot already holds this token: a resend after a lost
--               reply takes no second slot.
--             {0, wait}: a slot is free but ARGV[5] starts fell in the last ARGV[6] ms; the
--               next start is allowed in wait ms. Nothing changed (old starts are trimmed).
--             integer -1 (only with a finish record): it exists; nothing changed.
--             string 'pttl|fence|acquired_at|pid|host|task_id': every slot is held; the
--               holder of the slot that frees first (pttl its remaining TTL in ms).
--             error NOTLOCK: a slot key holds a string that is not a lock value.
"""
    + FUNCTIONS
    + """
local n, rate = tonumber(ARGV[4]), tonumber(ARGV[5])
if ARGV[8] ~= '' and is_finished(KEYS[n + 4], ARGV[8], ARGV[7], KEYS[n + 5]) then
  return -1
end
local token = string.sub(ARGV[2], 1, 32)
local free
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  if not v then
    free = free or i
  else
    if string.sub(v, 33, 33) ~= '|' then
      return redis.error_reply('NOTLOCK ' .. KEYS[i] .. ' holds a value that is not a lock')
    end
    if string.sub(v, 1, 32) == token then
      return {i, fence_of(v)}
    end
  end
end
if free and rate then
  local window, starts = tonumber(ARGV[6]), KEYS[n + 3]
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', starts, '-inf', now - window)
  if redis.call('ZCARD', starts) >= rate then
    local oldest = redis.call('ZRANGE', starts, 0, 0, 'WITHSCORES')
    return {0, math.max(1, tonumber(oldest[2]) + window - now)}
  end
  redis.call('ZADD', starts, now, token)
  redis.call('PEXPIRE', starts, window)
end
if free then
  return {free, take_lock(KEYS[free], ARGV[2], ARGV[1], ARGV[3], KEYS[n + 1], KEYS[n + 2], ARGV[9])}
end
local first, first_pttl
for i = 1, n do
  local pttl = redis.call('PTTL', KEYS[i])
  if pttl >= 0 and (not first_pttl or pttl < first_pttl) then
    first, first_pttl = i, pttl
  end
end
if not first then
  first, first_pttl = 1, -1
end
return first_pttl .. '|' .. string.sub(redis.call('GET', KEYS[first]), 34)
"""
)


def slot_key(keys: LockKeys, slot: int) -> str:
    """Key of the 1-based ``slot`` of the lock of ``keys`` (slot 1 is the lock key)."""
    return keys.lock if slot == 1 else f"{keys.lock}:slot:{slot}"


def slot_keys(keys: LockKeys, slot: int) -> LockKeys:
    """The keys a lease on ``slot`` uses: that slot's key, the lock's counter and channel (a
    release of any slot wakes the lock's waiters)."""
    if slot == 1:
        return keys
    return LockKeys(lock=slot_key(keys, slot), fence=keys.fence, channel=keys.channel)


def slot_of(key: str) -> int:
    """The 1-based slot of a lock or slot key."""
    head, _, slot = key.rpartition(":slot:")
    return int(slot) if head.endswith("}") and slot.isdigit() else 1


def acquire_call(
    keys: LockKeys,
    limit: int,
    ttl_ms: int,
    value: str,
    fencing: bool,
    rate: Optional[tuple[int, float]],
    shared: tuple[str, str],
    task_id: str,
    finished_ms: Optional[int],
    upgrading: bool,
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of :data:`ACQUIRE_SLOT` (``rate``: at most that many starts per that many
    seconds, or None; ``shared``: the fence counter and finish-record prefix of the lock's
    server or slot; ``finished_ms``: the finish records' lifetime to look for, or None)."""
    script_keys = [slot_key(keys, slot) for slot in range(1, limit + 1)]
    counter, finished = shared
    script_keys += (counter, keys.fence, keys.starts, finished, keys.finished(task_id))
    args: list[Any] = [ttl_ms, value, "1" if fencing else "0", limit]
    args += ("", "") if rate is None else (rate[0], max(1, int(rate[1] * 1000)))
    args += (task_id, "" if finished_ms is None else finished_ms, "1" if upgrading else "0")
    return script_keys, args
