"""Reading locks: who holds one, every lock under a prefix, fences.

For the CLI, the dead-child reclaim and tests; it never writes. Each read is one (pipelined)
round trip through the client.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Union

import redis
from redis.cluster import RedisCluster

from celery_singleton_lock.engine import server_errors, slots
from celery_singleton_lock.engine.keys import LockKeys, validate_prefix
from celery_singleton_lock.engine.latest import debounce_key
from celery_singleton_lock.engine.lease import LockHolder, as_int, as_text
from celery_singleton_lock.engine.shared_keys import SharedKeys
from celery_singleton_lock.errors import LockBackendUnavailable

#: What the engine talks to: one Redis (or a Sentinel group's master), or a Redis Cluster
#: (whose ``scan_iter`` scans every primary and whose pipeline sends each node its keys).
Client = Union[redis.Redis, RedisCluster]


class LockInspector:
    """Reads the locks under ``prefix`` on ``client``'s server."""

    def __init__(self, client: Client, *, prefix: str = "singleton-lock") -> None:
        self.client = client
        self.prefix = validate_prefix(prefix)

    def read(self, name: str) -> Optional[LockHolder]:
        """The holder of lock ``name``, or None when it is free: its lock key's, else (a lock
        taken by several holders, :mod:`.slots`) its lowest slot's.

        Raises:
            LockNotOwnedError: the lock's key holds data this package did not write.
        """
        return next(iter(self._holders(LockKeys.build(self.prefix, name), None)), None)

    def holders(self, name: str, limit: int) -> list[LockHolder]:
        """The holders of the first ``limit`` slots of lock ``name`` (its lock key as slot 1,
        and its slot table, :mod:`.slots`), slot by slot, in one round trip; a free slot has
        none.

        Raises:
            LockNotOwnedError: the lock key holds data this package did not write.
        """
        return self._holders(LockKeys.build(self.prefix, name), limit)

    def _holders(self, keys: LockKeys, limit: Optional[int]) -> list[LockHolder]:
        """The holder of the lock key of ``keys`` and those of its slot table up to slot
        ``limit`` (None: every slot), in one pipelined round trip."""
        table = keys.slot_table

        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            pipe.get(keys.lock)
            pipe.pttl(keys.lock)
            pipe.zrange(table[0], 0, -1, withscores=True)
            pipe.hgetall(table[1])  # the values are its 'v<slot>' fields
            return [*pipe.execute(), self._now_ms()]

        value, pttl, taken, values, now_ms = server_errors.call(fetch, keys.lock)
        held = []
        if value is not None:
            holder = LockHolder.from_value(keys.lock, value, pttl)
            if holder is None:
                raise server_errors.not_a_lock(keys.lock)
            held.append(holder)
        return held + _slot_holders(keys, now_ms, taken, values, limit)

    def per_server(self, name: str) -> list[tuple[str, Any]]:
        """``(server, holder or None or the error)`` of lock ``name``: one server's view here
        (a quorum's inspector gives each of its servers')."""
        try:
            seen: Any = self.read(name)
        except LockBackendUnavailable as exc:
            seen = exc
        return [(server_address(self.client), seen)]

    def fence(self, name: str) -> int:
        """The counter the fences of ``name`` come from (0 if none yet): every fence handed out
        for ``name`` is at most this and the next is above it. The counter is shared by many
        names (see :mod:`.shared_keys`), so it is ``name``'s last fence only if no other name
        was fenced since."""
        lock = LockKeys.build(self.prefix, name).lock
        shared = SharedKeys(self.prefix, cluster=isinstance(self.client, RedisCluster))
        counter = shared.of(lock)[0]
        return as_int(server_errors.call(lambda: self.client.get(counter), lock)) or 0

    def parked(self, name: str) -> list[str]:
        """The task ids parked behind lock ``name`` (policy ``queue``), oldest first."""
        key = LockKeys.build(self.prefix, name).parked
        return [
            as_text(task_id)
            for task_id in server_errors.call(lambda: self.client.zrange(key, 0, -1), key)
        ]

    def waiting_newest(self, name: str) -> Optional[tuple[str, Optional[float]]]:
        """For a lock whose newest call wins (``replace``, a debounce): the task id of the call
        waiting and, with a debounce, when it is due (epoch seconds by the server's clock);
        None for any other lock."""
        key = debounce_key(LockKeys.build(self.prefix, name))
        newest, due = server_errors.call(lambda: self.client.hmget(key, "newest", "due"), key)
        if newest is None:
            return None
        return as_text(newest), None if due is None else int(due) / 1000.0

    def parked_counts(self, lock_keys: list[str]) -> list[int]:
        """How many task ids are parked behind each of ``lock_keys`` (full lock keys), in one
        pipelined round trip."""
        # LockKeys.parked of each lock
        return [int(count) for (count,) in self._each_lock(lock_keys, ("zcard", ":parked"))]

    def rate_use(self, lock_keys: list[str]) -> list[tuple[int, Optional[float]]]:
        """For each of ``lock_keys`` (full lock keys): the starts its ``lock_rate`` window
        holds (a slot reserved for a parked call counts as one), and the seconds until that
        window is empty (None without a rate), in one pipelined round trip."""
        # LockKeys.starts of each lock
        replies = self._each_lock(lock_keys, ("zcard", ":starts"), ("pttl", ":starts"))
        return [(int(count), None if pttl < 0 else pttl / 1000.0) for count, pttl in replies]

    def _each_lock(self, lock_keys: list[str], *reads: tuple[str, str]) -> list[tuple[Any, ...]]:
        """The replies of ``reads`` (a command and the suffix of the lock key it reads) for
        each of ``lock_keys``, in one pipelined round trip."""
        if not lock_keys:
            return []

        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for key in lock_keys:
                for command, suffix in reads:
                    getattr(pipe, command)(f"{key}{suffix}")
            return pipe.execute()

        replies = server_errors.call(fetch, lock_keys[0])
        width = len(reads)
        return [tuple(replies[i : i + width]) for i in range(0, len(replies), width)]

    def scan(self, count: int = 500) -> Iterator[LockHolder]:
        """Every lock under this prefix, via ``SCAN`` (never ``KEYS``) plus pipelined reads.

        The pattern ``prefix:{*}`` only matches lock keys (a fence counter key ends in
        ``}:fence``), then ``prefix:{*}:slots`` the slot tables of locks taken by several
        holders (:mod:`.slots`, each slot a holder of its own); string keys there that are not
        lock values are skipped.
        """
        batch: list[str] = []
        try:
            pattern = f"{self.prefix}:{{*}}"
            for raw in self.client.scan_iter(match=pattern, count=count, _type="string"):
                batch.append(as_text(raw))
                if len(batch) >= count:
                    yield from self._read_many(batch, strict=False)
                    batch = []
            if batch:
                yield from self._read_many(batch, strict=False)
                batch = []
            pattern = f"{self.prefix}:{{*}}:slots"
            for raw in self.client.scan_iter(match=pattern, count=count, _type="zset"):
                batch.append(as_text(raw)[: -len(":slots")])
                if len(batch) >= count:
                    yield from self._read_tables(batch)
                    batch = []
        except server_errors.BACKEND_ERRORS as exc:
            raise LockBackendUnavailable(f"lock server unavailable during SCAN: {exc}") from exc
        if batch:
            yield from self._read_tables(batch)

    def _read_tables(self, locks: list[str]) -> list[LockHolder]:
        """The holders of the slot tables of ``locks`` (full lock keys), in one round trip."""

        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for lock in locks:
                pipe.zrange(f"{lock}:slots", 0, -1, withscores=True)
                pipe.hgetall(f"{lock}:slot-data")  # LockKeys.slot_table
            return [*pipe.execute(), self._now_ms()]

        *replies, now_ms = server_errors.call(fetch, locks[0])
        held: list[LockHolder] = []
        for index, lock in enumerate(locks):
            taken, values = replies[2 * index : 2 * index + 2]
            keys = LockKeys(lock, f"{lock}:released")
            held += _slot_holders(keys, now_ms, taken, values, None)
        return held

    def _now_ms(self) -> int:
        """The server's clock in ms (a slot's score is its end by that clock). Read after the
        slots: a slot read as live then was live when read. (On a Cluster, any node's clock.)"""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def queued_names(self, count: int = 500) -> Iterator[str]:
        """The names of the locks under this prefix that have a queued marker (enqueue
        deduplication, see ``LockKeys.queued``), via ``SCAN``."""
        pattern = f"{self.prefix}:{{*}}:queued"
        start, end = len(self.prefix) + 2, -len("}:queued")
        try:
            for raw in self.client.scan_iter(match=pattern, count=count, _type="string"):
                yield as_text(raw)[start:end]
        except server_errors.BACKEND_ERRORS as exc:
            raise LockBackendUnavailable(f"lock server unavailable during SCAN: {exc}") from exc

    def _read_many(self, lock_keys: list[str], *, strict: bool) -> list[LockHolder]:
        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for key in lock_keys:
                pipe.get(key)
                pipe.pttl(key)
            return pipe.execute()

        replies = server_errors.call(fetch, lock_keys[0])
        holders = []
        for key, value, pttl in zip(lock_keys, replies[0::2], replies[1::2]):
            if value is None:
                continue
            holder = LockHolder.from_value(key, value, pttl)
            if holder is not None:
                holders.append(holder)
            elif strict:
                raise server_errors.not_a_lock(key)
        return holders


def _slot_holders(
    keys: LockKeys, now_ms: int, taken: Any, values: Any, limit: Optional[int]
) -> list[LockHolder]:
    """The holders of a slot table read as ``ZRANGE slots 0 -1 WITHSCORES`` and ``HGETALL
    slot-data`` (:mod:`.slots`) with the server's clock ``now_ms``: its live slots up to
    ``limit`` (None: all), in slot order; a slot whose time has come, or given back (a score
    below 0), is free."""
    texts = {
        text[1:]: value
        for text, value in ((as_text(f), v) for f, v in values.items())
        if text[0] == "v"
    }
    held = []
    for raw, expiry in taken:
        slot, left = as_text(raw), int(expiry) - now_ms
        if left <= 0 or not slot.isdigit() or (limit is not None and int(slot) > limit):
            continue
        holder = LockHolder.from_value(slots.slot_key(keys, int(slot)), texts.get(slot), left)
        if holder is not None:
            held.append(holder)
    return sorted(held, key=lambda holder: slots.slot_of(holder.key))


def server_address(client: Any) -> str:
    """``host:port`` (or the socket path) of one server's client, for people."""
    pool: Any = getattr(client, "connection_pool", None)
    kwargs = pool.connection_kwargs if pool is not None else {}
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host')}:{kwargs.get('port')}"
