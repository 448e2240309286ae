"""A sweeper's look at the due locks on a Redis Cluster, where their index is one per slot.

A script touches the keys of one slot, so the index of locks a sweeper should look at (the
hand-off index of the queue and latest wins, the index of displaced calls left to mark) is
one sorted set per slot there (:mod:`.keys`). Reading all 16,384 at every tick would
cost a worker ~0.3 s of CPU (measured on 3 primaries on loopback), so each tick reads those
of a window of :data:`WINDOW` slots, in one cluster pipeline (one round trip per primary):
every slot is read every 16 ticks (16 s at the default sweep interval). That bounds how late
a sweeper finds a lock whose holder died (after its TTL) or whose reservation ran out; a
release hands the lock on itself and never waits for it. A debounce, whose end only a
sweeper acts on, is refused on a Cluster for that reason (``locker.CLUSTER``).

The window's reads compare scores with this process's clock (the scripts use the server's):
a lock found a little early is looked at and left as it is by the hand-on script, which reads
the lock itself.
"""

from __future__ import annotations

import time

from redis.crc import REDIS_CLUSTER_HASH_SLOTS

from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.keys import SharedKeys
from celery_singleton_lock.engine.lease import as_text
from celery_singleton_lock.engine.redis_server import RedisServer

#: slots whose index one tick reads
WINDOW = 1024


class SlotSweep:
    """The window of slots a sweeper reads next, of the per-slot copies of ``index``."""

    def __init__(self, server: RedisServer, index: str) -> None:
        self.server = server
        self.index = index
        self._next = 0

    def due(self, limit: int) -> list[str]:
        """The names due now in the next window's indexes (at most ``limit``). A slot with
        more than ``limit`` due is where the next window starts."""
        first = self._next
        slots = range(first, min(first + WINDOW, REDIS_CLUSTER_HASH_SLOTS))
        now_ms = int(time.time() * 1000)
        pipe = self.server.client.pipeline(transaction=False)
        for slot in slots:
            pipe.zrangebyscore(SharedKeys.of_slot(self.index, slot), "-inf", now_ms, 0, limit)
        replies = server_errors.call(pipe.execute, self.index)
        names: list[str] = []
        self._next = slots.stop % REDIS_CLUSTER_HASH_SLOTS
        for slot, reply in zip(slots, replies):
            if len(names) + len(reply) > limit:
                self._next = slot  # read again from here next tick
                break
            names.extend(as_text(name) for name in reply)
            if len(reply) == limit:  # more may be due there
                self._next = slot
                break
        return names
