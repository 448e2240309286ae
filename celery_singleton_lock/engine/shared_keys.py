"""Keys shared by many locks: the fence counter and the finish-record buckets.

Before, every fenced lock name had a counter key of its own that never expired (one key per
distinct name, for ever) and every finished ``acks_late`` task left a key of its own (~340
bytes) for ``lock_finished_ttl``. Both are now shared, so the number of keys is bounded
whatever the number of distinct lock names:

    P:fence                        the fence counter of the whole server (one string, never
                                   expires). Strictly increasing overall, hence strictly
                                   increasing per lock name.
    P:finished:<W>:<b>             finish records: a set of task ids finished in bucket ``b``
                                   (server time in ms // W, W = the record lifetime in ms),
                                   expiring at the end of bucket ``b + 1``, so a record
                                   lives at least W and at most 2 W.

On a Redis Cluster a script may only touch keys of one hash slot, so there is one counter
and one set of buckets per slot: the same names with ``:{T}`` appended, where ``T`` is a
short tag hashing to the lock's slot (:func:`slot_tag`). At most 16,384 counters, however
many lock names.

The old per-name keys (``P:{N}:fence``, ``P:{N}:finished:<task id>``) are still read, so a
worker of this version beside one of the previous version never hands out a fence lower than
one already handed out and still drops a copy finished there: see :data:`FUNCTIONS`.
"""

from __future__ import annotations

from typing import Optional

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

_slot_tags: Optional[list[str]] = None


def slot_tag(slot: int) -> str:
    """A short hash tag whose Redis Cluster slot is ``slot`` (the table is made once, on a
    cluster only: about 170,000 CRC16 computations in C, a fraction of a second)."""
    global _slot_tags
    if _slot_tags is None:
        tags: list[Optional[str]] = [None] * REDIS_CLUSTER_HASH_SLOTS
        missing, i = REDIS_CLUSTER_HASH_SLOTS, 0
        while missing:  # ends: base-36 counting covers every slot within a few 10^5 tags
            tag = _base36(i)
            found = key_slot(tag.encode())
            if tags[found] is None:
                tags[found] = tag
                missing -= 1
            i += 1
        _slot_tags = [tag for tag in tags if tag is not None]
    return _slot_tags[slot]


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, digit = divmod(number, 36)
        text = digits[digit] + text
        if not number:
            return text


class SharedKeys:
    """The fence counter and finish-record bucket prefix shared by the locks of a prefix (on a
    cluster: by the locks of one slot)."""

    __slots__ = ("_per_slot", "cluster", "counter", "finished", "prefix")

    def __init__(self, prefix: str, *, cluster: bool) -> None:
        self.prefix = prefix
        self.cluster = cluster
        self.counter = f"{prefix}:fence"
        self.finished = f"{prefix}:finished"
        self._per_slot: dict[int, tuple[str, str]] = {}

    def of(self, lock_key: str) -> tuple[str, str]:
        """``(fence counter key, finish-record bucket prefix)`` for the lock at ``lock_key``."""
        if not self.cluster:
            return self.counter, self.finished
        slot = key_slot(lock_key.encode())
        pair = self._per_slot.get(slot)
        if pair is None:
            tag = slot_tag(slot)
            pair = (f"{self.counter}:{{{tag}}}", f"{self.finished}:{{{tag}}}")
            self._per_slot[slot] = pair
        return pair


#: Lua functions prepended to the scripts that take, fence or release a lock, or keep finish
#: records: where the lock value's fence is written and read, and a finish is recorded.
FUNCTIONS = """
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whether task id `id` has a finish record: in the bucket set of now or of the bucket before
-- under prefix `base` for records living `width` ms, or (written by the previous version)
-- at the per-name key `legacy`.
local function is_finished(base, width, id, legacy)
  local b = math.floor(server_ms() / tonumber(width))
  local sets = base .. ':' .. width .. ':'
  return redis.call('SISMEMBER', sets .. string.format('%d', b), id) == 1
    or redis.call('SISMEMBER', sets .. string.format('%d', b - 1), id) == 1
    or redis.call('EXISTS', legacy) == 1
end

-- Record that task id `id` finished, for at least `width` ms (at most twice that).
local function record_finished(base, width, id)
  local w = tonumber(width)
  local b = math.floor(server_ms() / w)
  local set = base .. ':' .. width .. ':' .. string.format('%d', b)
  redis.call('SADD', set, id)
  redis.call('PEXPIREAT', set, string.format('%d', (b + 2) * w))
end

-- The next fence from the shared `counter`. A per-name counter `legacy` left by the previous
-- version lifts the shared one above it first (no fence below one already handed out) and is
-- then kept in step, so a worker of the previous version still counts on from there; with
-- `keep_legacy` == '1' (an upgrade under way) it is written even when absent.
local function next_fence(counter, legacy, keep_legacy)
  local fence = redis.call('INCR', counter)
  local old = redis.call('GET', legacy)
  if old then
    old = tonumber(old)
    if old >= fence then
      fence = old + 1
      redis.call('SET', counter, fence)
    end
  end
  if old or keep_legacy == '1' then
    redis.call('SET', legacy, fence)
  end
  return fence
end

-- Take the free lock `key`: SET it to `value` (a lock value with an empty fence,
-- '<token>||...') for `ttl` ms; with `fencing` == '1' the next fence (next_fence of
-- `counter`, `legacy`, `keep_legacy`) is written into the value. Returns the fence, or 0.
local function take_lock(key, value, ttl, fencing, counter, legacy, keep_legacy)
  local fence = 0
  if fencing == '1' then
    fence = next_fence(counter, legacy, keep_legacy)
    value = string.sub(value, 1, 33) .. string.format('%d', fence) .. string.sub(value, 34)
  end
  redis.call('SET', key, value, 'PX', ttl)
  return fence
end

-- The fence in the lock value `v` (0 when it was taken without fencing).
local function fence_of(v)
  return tonumber(string.match(v, '^%d+', 34)) or 0
end

-- A release of an owner that ran to the end: record task id `id` finished (record_finished)
-- and, with `upgrading` == '1', write the previous version's per-name record `legacy` too
-- (the released value `v` without its token, for `width` ms).
local function record_release(base, width, id, upgrading, legacy, v)
  record_finished(base, width, id)
  if upgrading == '1' then
    redis.call('SET', legacy, string.sub(v, 34), 'PX', width)
  end
end
"""
