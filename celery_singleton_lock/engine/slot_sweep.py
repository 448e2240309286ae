"""A sweeper's look at the due locks on a Redis Cluster, where their index is one per slot.

A script touches the keys of one slot, so the index of locks a sweeper should look at (the
hand-off index of the queue and latest wins, the index of displaced calls left to mark) is
one sorted set per slot there (:mod:`.keys`). Reading all 16,384 at every tick would
cost a worker ~0.3 s of CPU (measured on 3 primaries on loopback), so each tick reads those
of a window of :data:`WINDOW` slots, in one cluster pipeline (one round trip per primary):
every slot is read every 16 ticks (16 s at the default sweep interval).

That rotation is the backstop. The hand-off indexes also have a summary (:class:`DueSlots`,
``P:due-slots``): the slots a sweeper should read, scored by when. A client marks a slot
there after a script call that may have put a lock due earlier than the summary says (a call
parked or waiting as latest wins' newest, a release that handed on or left calls parked or a
debounced call waiting, a pause set or ended); each tick reads
the slots due now in it first, and re-scores each to its index's next due time once looked at
(removed when the index is empty), unless a client marked it since. So a lock whose holder
died (after its TTL), whose reservation ran out or whose pause ended is found at the next
tick, not up to 16 s late; a mark lost (a client that died between its script and the mark)
is still found by the rotation. An uncontended acquire or release marks nothing. So a
debounced call, whose due time only a sweeper acts on, runs at its next tick after that time.

The reads compare scores with this process's clock (the scripts use the server's, a mark the
marking client's): a lock found a little early is looked at and left as it is by the hand-on
script, which reads the lock itself.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Optional

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.keys import SharedKeys, due_slots
from celery_singleton_lock.engine.lease import as_text
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import RedisServer

#: slots whose index one tick reads
WINDOW = 1024
#: at most this many slots of the summary read per tick (more due wait for the next tick)
SUMMARY_READ = 128


def _now_ms() -> int:
    return int(time.time() * 1000)


class DueSlots:
    """The summary ``P:due-slots`` of a Redis Cluster's hand-off indexes (the per-slot copies
    of ``index``): which slots a sweeper should read, and when (see the module docstring)."""

    def __init__(self, server: RedisServer, prefix: str, index: str) -> None:
        self.server = server
        self.key = due_slots(prefix)
        self.index = index
        self._rescore = server.register(source("rescore_due_slots"))

    def mark(self, lock_key: str) -> None:
        """A script just put the lock at ``lock_key`` due in its slot's index (maybe earlier
        than the summary says): a sweeper reads that slot at its next tick. One round trip."""
        self.mark_slots((key_slot(lock_key.encode()),))

    def mark_slots(self, slots: Iterable[int]) -> None:
        """:meth:`mark` for the slots ``slots``, in one command. A new score each time (now):
        a sweeper's re-score of a slot read before the mark then leaves the mark as it is."""
        now = _now_ms()
        marks = {str(slot): now for slot in slots}
        if marks:
            server_errors.call(lambda: self.server.client.zadd(self.key, marks), self.key)

    def due(self) -> dict[int, float]:
        """The slots due now (at most :data:`SUMMARY_READ`), with the score read for each."""
        key = self.key
        entries: Any = server_errors.call(
            lambda: self.server.client.zrange(key, 0, SUMMARY_READ - 1, withscores=True), key
        )
        now = _now_ms()
        return {int(slot): float(score) for slot, score in entries if score <= now}

    def rescore(self, seen: dict[int, float]) -> None:
        """After a sweeper looked at the due locks of the slots ``seen`` (each with the score it
        read): each is re-scored to its index's next due time, or removed when the index is
        empty, if no client marked it since (lua/rescore_due_slots.lua). Two round trips: the
        indexes' first entries (one per primary), then the summary."""
        if not seen:
            return
        slots = list(seen)
        pipe = self.server.client.pipeline(transaction=False)
        for slot in slots:
            pipe.zrange(SharedKeys.of_slot(self.index, slot), 0, 0, withscores=True)
        firsts = server_errors.call(pipe.execute, self.index)
        args: list[object] = []
        for slot, first in zip(slots, firsts):
            args += (slot, repr(seen[slot]), int(first[0][1]) if first else "")
        self.server.run(self._rescore, self.key, [self.key], args)


class SlotSweep:
    """The window of slots a sweeper reads next, of the per-slot copies of ``index``, and the
    slots ``summary`` says are due (the hand-off indexes'; None for another index)."""

    def __init__(self, server: RedisServer, index: str, summary: Optional[DueSlots] = None) -> None:
        self.server = server
        self.index = index
        self.summary = summary
        self._next = 0
        #: the summary's slots read at the last tick, with their scores then: re-scored at the
        #: next, once the sweeper has looked at their locks
        self._seen: dict[int, float] = {}

    def due(self, limit: int) -> list[str]:
        """The names due now in the summary's due slots, then in the next window's indexes
        (at most ``limit`` in all). A window slot with more than ``limit`` due is where the
        next window starts."""
        names: list[str] = []
        summary = self.summary
        if summary is not None:
            summary.rescore(self._seen)  # looked at since the last tick
            self._seen = summary.due()
            names, _ = self._read(list(self._seen), limit)
        if len(names) >= limit:
            return names
        first = self._next
        window = range(first, min(first + WINDOW, REDIS_CLUSTER_HASH_SLOTS))
        found, stopped = self._read(list(window), limit - len(names))
        self._next = window.stop % REDIS_CLUSTER_HASH_SLOTS if stopped is None else stopped
        return names + found

    def _read(self, slots: list[int], limit: int) -> tuple[list[str], Optional[int]]:
        """The names due now in the indexes of ``slots`` (at most ``limit``, in one cluster
        pipeline), and the slot where reading stopped (None: all read): more may be due
        there."""
        if not slots or limit <= 0:
            return [], (slots[0] if slots else None)
        now_ms = _now_ms()
        pipe = self.server.client.pipeline(transaction=False)
        for slot in slots:
            pipe.zrangebyscore(SharedKeys.of_slot(self.index, slot), "-inf", now_ms, 0, limit)
        replies = server_errors.call(pipe.execute, self.index)
        names: list[str] = []
        for slot, reply in zip(slots, replies):
            if len(names) + len(reply) > limit:
                return names, slot  # read again from here next tick
            names.extend(as_text(name) for name in reply)
            if len(reply) == limit:  # more may be due there
                return names, slot
        return names, None
