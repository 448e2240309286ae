"""Keys shared by many locks: the fence counter and the finish-record sets, so the number of
keys is bounded whatever the number of distinct lock names:

    P:fence                        the fence counter of the whole server (one string, never
                                   expires). Strictly increasing overall, hence strictly
                                   increasing per lock name.
    P:finished:<n>                 finish records (lua/includes/finish_records.lua): a sorted
                                   set of task ids scored by their expiry, for the ids with
                                   ``crc32(task_id) % SHARDS == n``. The client names it, so
                                   it is among the script's KEYS (Redis Cluster, its proxies
                                   and Dragonfly refuse a key made inside a script). At 1,000
                                   finished tasks/s kept 1 h (3.6M records) a set holds ~110,
                                   within Redis's compact listpack encoding (128 entries by
                                   default): ~50 bytes a record, and what expires at once
                                   is one small set.

    P:handoff-due                  the lock names a hand-off sweeper should look at, by when
                                   (lua/includes/handoff.lua)
    P:superseded-due               the lock names with displaced calls left to mark, by when
                                   (lua/includes/displace.lua)
    P:cap:F                        a family's live rule (live_rules.py); on a cluster only
                                   its copies, one per slot

On a Redis Cluster a script may only touch keys of one hash slot, so there is one counter,
one set of finish-record sets, one of each index and a copy of each live rule per slot: the
same names with ``:{T}`` inserted after ``fence`` / ``finished`` (appended to the indexes and
rules), where ``T`` is a short tag hashing to the lock's slot (:func:`slot_tag`), and
``CLUSTER_SHARDS`` sets per slot (fewer: the records spread over the slots; all of them in
one slot, e.g. a single lock name, still leave ~3,500 per set). At most 16,384 counters,
however many lock names. The scripts that use them: ``lua/includes/take_lock.lua``,
``lua/includes/finish_records.lua``, and those of the queue and latest wins; a sweeper reads
the indexes of a window of slots per tick (:mod:`.slot_sweep`).
"""

from __future__ import annotations

from typing import Optional
from zlib import crc32

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from celery_singleton_lock.engine.keys import handoff_index

#: finish-record sets of one server (see the module docstring)
SHARDS = 32_768
#: finish-record sets of one cluster slot
CLUSTER_SHARDS = 1_024

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
    """The fence counter and finish-record sets shared by the locks of a prefix (on a cluster:
    by the locks of one slot)."""

    __slots__ = (
        "_per_slot",
        "cluster",
        "counter",
        "finished",
        "handoff",
        "prefix",
        "shards",
        "superseded",
    )

    def __init__(self, prefix: str, *, cluster: bool) -> None:
        self.prefix = prefix
        self.cluster = cluster
        self.counter = f"{prefix}:fence"
        self.finished = f"{prefix}:finished"
        #: the indexes of due locks: one each per prefix (per slot on a cluster: ``:{T}``)
        self.handoff = handoff_index(prefix)
        self.superseded = f"{prefix}:superseded-due"
        #: how many sets the finish records are spread over (per slot on a cluster)
        self.shards = CLUSTER_SHARDS if cluster else SHARDS
        self._per_slot: dict[int, tuple[str, str]] = {}

    def of(self, lock_key: str, task_id: str = "") -> tuple[str, str]:
        """``(fence counter key, finish-record set of task_id)`` for the lock at ``lock_key``."""
        counter, finished = self.counter, self.finished
        if self.cluster:
            slot = key_slot(lock_key.encode())
            pair = self._per_slot.get(slot)
            if pair is None:
                tag = slot_tag(slot)
                pair = (f"{counter}:{{{tag}}}", f"{finished}:{{{tag}}}")
                self._per_slot[slot] = pair
            counter, finished = pair
        return counter, f"{finished}:{crc32(task_id.encode()) % self.shards}"

    def handoff_index(self, lock_key: str) -> str:
        """The hand-off index that holds the lock at ``lock_key`` (its slot's on a cluster)."""
        if not self.cluster:
            return self.handoff
        return f"{self.handoff}:{{{slot_tag(key_slot(lock_key.encode()))}}}"

    def superseded_index(self, lock_key: str) -> str:
        """The index of displaced calls left to mark that holds the lock at ``lock_key``."""
        if not self.cluster:
            return self.superseded
        return f"{self.superseded}:{{{slot_tag(key_slot(lock_key.encode()))}}}"

    def rule_of(self, cap_key: str, lock_key: str) -> str:
        """The copy of a family's live rule ``cap_key`` (:mod:`.live_rules`) that the acquire
        of the lock at ``lock_key`` reads: the key itself on one server, its copy in the
        lock's slot on a cluster ("" without a rule). A copy is returned as it is: the rule
        a parked call stored names its copy (a family, a lock name's start, has no brace)."""
        if not (self.cluster and cap_key) or cap_key.endswith("}"):
            return cap_key
        return f"{cap_key}:{{{slot_tag(key_slot(lock_key.encode()))}}}"

    @staticmethod
    def of_slot(index: str, slot: int) -> str:
        """The cluster slot ``slot``'s copy of the prefix-wide key ``index``."""
        return f"{index}:{{{slot_tag(slot)}}}"
