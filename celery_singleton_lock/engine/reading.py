"""Reading locks: who holds one, every lock under a prefix, fences.

For the CLI, the dead-child reclaim and tests; it writes nothing but the held index's entries
of keys it found gone. Each read is one (pipelined) round trip through the client.

Every lock under a prefix (:meth:`LockInspector.scan`) is read from the held index on one
server or a Sentinel group's primary (``P:held``, lua/includes/held_index.lua: the scripts that
take, renew and release a lock keep it), so reading costs O(held locks) whatever else the
database holds; on a Redis Cluster, where no lock's script may write that one key, by SCAN of
every primary (O(keys in the database)).
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Optional, Union

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.crc import REDIS_CLUSTER_HASH_SLOTS

from celery_singleton_lock.engine import server_errors, slots
from celery_singleton_lock.engine.keys import (
    LockKeys,
    SharedKeys,
    handoff_index,
    held_index,
    marker_index,
    validate_prefix,
)
from celery_singleton_lock.engine.latest import debounce_key
from celery_singleton_lock.engine.lease import LockHolder, as_int, as_text
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.errors import LockBackendUnavailable

#: What the engine talks to: one Redis (or a Sentinel group's master), or a Redis Cluster
#: (whose ``scan_iter`` scans every primary and whose pipeline sends each node its keys).
Client = Union[redis.Redis, RedisCluster]


#: the end of a slot table's key (keys.LockKeys.slot_table) as written in the held index
_TABLE = "}:slots"


class LockInspector:
    """Reads the locks under ``prefix`` on ``client``'s server."""

    def __init__(self, client: Client, *, prefix: str = "singleton-lock") -> None:
        self.client = client
        self.prefix = validate_prefix(prefix)
        #: the held index read by :meth:`scan`; None on a Redis Cluster (SCAN there: the index
        #: has no hash tag, so no lock's script may write it, see keys.held_index)
        self.held: Optional[str] = (
            None if isinstance(client, RedisCluster) else held_index(self.prefix)
        )
        #: the marker index read by :meth:`marker_keys` (None on a Redis Cluster: SCAN there)
        self.markers: Optional[str] = (
            None if isinstance(client, RedisCluster) else marker_index(self.prefix)
        )
        self._trim: Optional[Script] = None

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
        names (see :mod:`.keys`), so it is ``name``'s last fence only if no other name
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

    def parked_locks(self, limit: int = 10_000) -> list[tuple[str, int, bool]]:
        """``(lock name, calls parked, lock key held)`` of at most ``limit`` locks with calls
        parked (policies ``queue`` and ``replace``), from the hand-off index (every lock with a
        parked call is in it, see lua/includes/handoff.lua), in two round trips: no SCAN. On
        a Redis Cluster the index is one per slot: all 16,384 are read in one cluster
        pipeline (one round trip per primary, ~0.1-0.3 s of this process's CPU)."""
        index = handoff_index(self.prefix)
        if isinstance(self.client, RedisCluster):
            names = self._per_slot(index, limit)
        else:
            reply = server_errors.call(lambda: self.client.zrange(index, 0, limit - 1), index)
            names = [as_text(name) for name in reply]
        keys = [LockKeys.build(self.prefix, name) for name in names]
        now_ms = int(time.time() * 1000)

        def fetch() -> list[Any]:
            # held: the lock key, or a slot of its table (a queue's, a limit's) not yet free
            pipe = self.client.pipeline(transaction=False)
            for lock in keys:
                pipe.zcard(lock.parked)
                pipe.exists(lock.lock)
                pipe.zcount(lock.slot_table[0], now_ms, "+inf")
            return pipe.execute()

        replies = server_errors.call(fetch, keys[0].lock) if keys else []
        return [
            (name, int(count), bool(held or slots))
            for name, count, held, slots in zip(names, *(replies[i::3] for i in range(3)))
            if count
        ]

    def _per_slot(self, index: str, limit: int) -> list[str]:
        """At most ``limit`` members of the cluster's per-slot copies of ``index``."""

        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for slot in range(REDIS_CLUSTER_HASH_SLOTS):
                pipe.zrange(SharedKeys.of_slot(index, slot), 0, limit - 1)
            return pipe.execute()

        names = [as_text(name) for reply in server_errors.call(fetch, index) for name in reply]
        return names[:limit]

    def shared_counts(self) -> Optional[tuple[int, int]]:
        """``(fence counters, finish records)`` on one server, read from the shared keys by
        name (:mod:`.keys`: one counter, ``SHARDS`` finish-record sets) in one
        pipelined round trip: no SCAN. None on a Redis Cluster (their names depend on the
        slots in use: SCAN them there)."""
        if isinstance(self.client, RedisCluster):
            return None
        shared = SharedKeys(self.prefix, cluster=False)

        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            pipe.exists(shared.counter)
            for shard in range(shared.shards):
                pipe.zcard(f"{shared.finished}:{shard}")
            return pipe.execute()

        replies = server_errors.call(fetch, shared.counter)
        return int(replies[0]), sum(int(count) for count in replies[1:])

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
        """Every lock (and slot) held under this prefix, ``count`` at a time, as they are read
        (a generator: nothing is collected). From the held index on one server (see the module
        docstring), else by ``SCAN`` (:meth:`scan_keys`). A key may be yielded twice when the
        server rehashes the index (or the keyspace) meanwhile, as SCAN may."""
        if self.held is None:
            return self.scan_keys(count)
        return self._from_index(self.held, count)

    def _from_index(self, index: str, count: int) -> Iterator[LockHolder]:
        """The holders of the keys in the held ``index``, by ``ZSCAN`` (its cursor walks the
        set's hash table, so an entry whose score a renewal moves is still read once, where
        paging by score would read it again), ``count`` keys per pipelined read. The entries
        of keys found gone (a holder that died, a key that expired) are dropped."""
        cursor: Any = 0
        try:
            while True:
                cursor, entries = self.client.zscan(index, cursor, count=count)
                keys = [as_text(key) for key, _ in entries]
                # a slot has no key: its lock's slot table is indexed, read as its live slots
                tables = [key for key in keys if key.endswith(_TABLE)]
                keys = [key for key in keys if not key.endswith(_TABLE)]
                if keys:
                    holders, gone = self._read_batch(keys)
                    if gone:
                        self._drop_gone(index, gone)
                    yield from holders
                if tables:
                    holders, gone = self._read_indexed_tables(tables)
                    if gone:
                        self._drop_gone(index, gone)
                    yield from holders
                if not cursor:
                    return
        except server_errors.BACKEND_ERRORS as exc:
            raise LockBackendUnavailable(f"lock server unavailable reading {index}: {exc}") from exc

    def _drop_gone(self, index: str, gone: list[str]) -> None:
        """Take ``gone`` keys out of the held index, each only if still gone (lua/trim_held.lua)."""
        if self._trim is None:
            self._trim = self.client.register_script(source("trim_held"))
        self._trim(keys=[index, *gone], client=self.client)

    def scan_keys(self, count: int = 500) -> Iterator[LockHolder]:
        """Every lock under this prefix, via ``SCAN`` (never ``KEYS``) plus pipelined reads:
        O(keys in the database), what :meth:`scan` does on a Redis Cluster.

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
                    yield from self._read_batch(batch)[0]
                    batch = []
            if batch:
                yield from self._read_batch(batch)[0]
                batch = []
            pattern = f"{self.prefix}:{{*}}:slots"
            for raw in self.client.scan_iter(match=pattern, count=count, _type="zset"):
                batch.append(as_text(raw)[: -len(":slots")])
                if len(batch) >= count:
                    yield from self._read_tables_found(batch)[0]
                    batch = []
        except server_errors.BACKEND_ERRORS as exc:
            raise LockBackendUnavailable(f"lock server unavailable during SCAN: {exc}") from exc
        if batch:
            yield from self._read_tables_found(batch)[0]

    def _read_indexed_tables(self, tables: list[str]) -> tuple[list[LockHolder], list[str]]:
        """The holders of the slot tables named in the held index (their ``:slots`` keys), and
        the tables that are gone (the key deleted or expired: a table with no slot taken
        left is still there until then, and lists nothing)."""
        locks = [table[: -len(":slots")] for table in tables]
        holders, found = self._read_tables_found(locks)
        return holders, [table for table, there in zip(tables, found) if not there]

    def _read_tables_found(self, locks: list[str]) -> tuple[list[LockHolder], list[bool]]:
        """The holders of the slot tables of ``locks`` (full lock keys) and whether each table
        is there, in one round trip."""

        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for lock in locks:
                pipe.zrange(f"{lock}:slots", 0, -1, withscores=True)
                pipe.hgetall(f"{lock}:slot-data")  # LockKeys.slot_table
            return [*pipe.execute(), self._now_ms()]

        *replies, now_ms = server_errors.call(fetch, locks[0])
        held: list[LockHolder] = []
        found: list[bool] = []
        for index, lock in enumerate(locks):
            taken, values = replies[2 * index : 2 * index + 2]
            keys = LockKeys(lock, f"{lock}:released")
            held += _slot_holders(keys, now_ms, taken, values, None)
            found.append(bool(taken))  # a sorted set is never empty: none is no key
        return held, found

    def _now_ms(self) -> int:
        """The server's clock in ms (a slot's score is its end by that clock). Read after the
        slots: a slot read as live then was live when read. (On a Cluster, any node's clock.)"""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def queued_names(self, count: int = 500) -> Iterator[str]:
        """The names of the locks under this prefix that have a queued marker (enqueue
        deduplication, see ``LockKeys.queued``): :meth:`marker_keys`."""
        start, end = len(self.prefix) + 2, -len("}:queued")
        for key in self.marker_keys(count):
            yield key[start:end]

    def marker_keys(self, count: int = 500) -> Iterator[str]:
        """The queued marker keys under this prefix, ``count`` at a time: from the marker
        index on one server (O(markers); the entries of markers found gone are dropped), by
        ``SCAN`` of the keyspace on a Redis Cluster."""
        index = self.markers
        try:
            if index is None:
                pattern = f"{self.prefix}:{{*}}:queued"
                for raw in self.client.scan_iter(match=pattern, count=count, _type="string"):
                    yield as_text(raw)
                return
            cursor: Any = 0
            while True:
                cursor, entries = self.client.zscan(index, cursor, count=count)
                keys = [as_text(key) for key, _ in entries]
                if keys:
                    pipe = self.client.pipeline(transaction=False)
                    for key in keys:
                        pipe.exists(key)
                    there = pipe.execute()
                    gone = [key for key, found in zip(keys, there) if not found]
                    if gone:
                        self._drop_gone(index, gone)
                    yield from (key for key, found in zip(keys, there) if found)
                if not cursor:
                    return
        except server_errors.BACKEND_ERRORS as exc:
            raise LockBackendUnavailable(f"lock server unavailable reading markers: {exc}") from exc

    def _read_batch(self, lock_keys: list[str]) -> tuple[list[LockHolder], list[str]]:
        """The holders of ``lock_keys`` (those that are not lock values skipped), and the
        keys that are gone, in one pipelined round trip."""

        def fetch() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for key in lock_keys:
                pipe.get(key)
                pipe.pttl(key)
            return pipe.execute()

        replies = server_errors.call(fetch, lock_keys[0])
        holders, gone = [], []
        for key, value, pttl in zip(lock_keys, replies[0::2], replies[1::2]):
            if value is None:
                gone.append(key)
                continue
            holder = LockHolder.from_value(key, value, pttl)
            if holder is not None:
                holders.append(holder)
        return holders, gone


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
