"""Reading the locks of the PostgreSQL backend (its :class:`~..backend.LockReader`): who holds
one or its slots, every live lease under the prefix (a SELECT, a page at a time), the fence
sequence, the names with a queued marker, the calls parked behind a lock
(:mod:`.parked_reading`)."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.lease import LockHolder
from celery_singleton_lock.engine.postgres.connections import Connections, Row, where
from celery_singleton_lock.engine.postgres.parked_reading import ParkedReads
from celery_singleton_lock.engine.postgres.rows import key_of_row, slot_row
from celery_singleton_lock.engine.postgres.statements import COOLDOWN_PID, Statements
from celery_singleton_lock.engine.slots import slot_of
from celery_singleton_lock.errors import LockBackendUnavailable


def holder_of(key: str, row: Row) -> LockHolder:
    """The holder that ``row`` (``fence, pid, host, task_id, acquired_at, seconds left``)
    names, under the lock ``key``. Pid -1 is a cooldown's (``Statements.release_cooling``):
    the row holds the run that ended, its lease the cooldown left."""
    fence, pid, host, task_id, acquired_at, left = row
    return LockHolder(
        key=key,
        task_id=task_id or "",
        host=host or "",
        pid=None if pid == COOLDOWN_PID else pid,
        acquired_at=acquired_at,
        fence=fence,
        ttl=None if left is None else max(0.0, float(left)),
        cooling=pid == COOLDOWN_PID,
    )


class PostgresInspector:
    """Reads the locks under ``prefix`` in the tables of ``statements``."""

    def __init__(
        self,
        connections: Connections,
        statements: Statements,
        prefix: str,
        parked_reads: ParkedReads,
        ready: Callable[[], None] = lambda: None,
    ) -> None:
        self.prefix = prefix
        #: creates the admission tables if not known to exist (a database the leases table
        #: of an earlier version is in has none until a process of this one made them)
        self._ready = ready
        self._connections = connections
        self._statements = statements
        # the calls parked behind the locks (policies queue, replace): parked_reading.py
        self.parked = parked_reads.parked
        self.waiting_newest = parked_reads.waiting_newest
        self.parked_counts = parked_reads.parked_counts
        self.parked_locks = parked_reads.parked_locks

    def _key(self, name: str) -> str:
        return LockKeys.build(self.prefix, name).lock

    def read(self, name: str) -> Optional[LockHolder]:
        """The live holder of lock ``name``, or None when it is free."""
        key = self._key(name)
        rows = self._connections.read(
            self._statements.read, {"prefix": self.prefix, "name": name}, key
        )
        return holder_of(key, rows[0][1:]) if rows else None

    def holders(self, name: str, limit: int) -> list[LockHolder]:
        """The live holders of the ``limit`` slots of ``name`` (see :mod:`.rows`)."""
        if limit <= 1:
            holder = self.read(name)
            return [] if holder is None else [holder]
        rows = self._connections.run(
            self._statements.holders,
            {"prefix": self.prefix, "names": [slot_row(name, k) for k in range(1, limit + 1)]},
            self._key(name),
        )
        holders = [holder_of(key_of_row(self.prefix, row[0]), row[1:]) for row in rows]
        return sorted(holders, key=lambda holder: slot_of(holder.key))

    def rate_use(self, lock_keys: list[str]) -> list[tuple[int, Optional[float]]]:
        """For each of ``lock_keys`` (full lock keys): the starts its ``lock_rate`` window
        holds, and the seconds until that window is empty (None without a start in it)."""
        if not lock_keys:
            return []
        self._ready()
        names = [LockKeys(key, "").name for key in lock_keys]
        rows = self._connections.run(
            self._statements.rate_use, {"prefix": self.prefix, "names": names}, lock_keys[0]
        )
        return [(int(count), None if left is None else max(0.0, left)) for count, left in rows]

    def per_server(self, name: str) -> list[tuple[str, Any]]:
        """``(server, holder or None or the error)`` of lock ``name``: the one database's."""
        try:
            seen: Any = self.read(name)
        except LockBackendUnavailable as exc:
            seen = exc
        return [(where(self._connections.conninfo), seen)]

    def fence(self, name: str) -> int:
        """The sequence's last fence (shared by every name, as the Redis counter is): every
        fence handed out for ``name`` is at most this, and the next is above it."""
        rows = self._connections.run(self._statements.fence, None, self._key(name))
        return int(rows[0][0]) if rows else 0

    def server_settings(self) -> dict[str, str]:
        """What ``locks doctor`` checks of the server: whether it is a standby
        (``in_recovery``), the settings a committed lease's durability and a writable
        session depend on, and its version."""
        rows = self._connections.run(
            "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', "
            "'synchronous_commit', 'default_transaction_read_only', 'server_version') "
            "UNION ALL SELECT 'in_recovery', pg_is_in_recovery()::text",
            None,
            self.prefix,
        )
        return {str(name): str(value) for name, value in rows}

    def scan(self, count: int = 500) -> Iterator[LockHolder]:
        """Every live lease under the prefix, by name, ``count`` rows per SELECT."""
        rows = self._by_name(self._statements.scan, count, self._connections.read)
        return (holder_of(key_of_row(self.prefix, row[0]), row[1:]) for row in rows)

    def queued_names(self, count: int = 500) -> Iterator[str]:
        """The names of the locks under the prefix with a live queued marker, by name."""
        self._ready()
        rows = self._by_name(self._statements.queued_names, count, self._connections.run)
        return (name for (name,) in rows)

    def _by_name(
        self, statement: str, count: int, run: Callable[[str, Any, str], list[Row]]
    ) -> Iterator[Row]:
        """The rows ``run`` answers to ``statement`` (whose first column is the lock name),
        ``count`` per SELECT, each page after the last name of the one before."""
        after = ""
        while True:
            rows = run(
                statement, {"prefix": self.prefix, "after": after, "count": count}, self.prefix
            )
            yield from rows
            if len(rows) < count:
                return
            after = rows[-1][0]
