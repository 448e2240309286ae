"""Keys shared by many locks: the fence counter and the finish-record buckets, so the number of
keys is bounded whatever the number of distinct lock names:

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
many lock names. The scripts that use them: ``lua/includes/take_lock.lua`` and
``lua/includes/finish_records.lua``.
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
