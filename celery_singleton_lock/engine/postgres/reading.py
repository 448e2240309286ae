"""Reading the locks of the PostgreSQL backend (its :class:`~..backend.LockReader`): who holds
one, every live lease under the prefix (a SELECT, a page at a time), the fence sequence, the
calls parked behind a lock (:mod:`.parked_reading`). The parts this backend does not have
(queued markers, rates) read as none, which is true: none can be made here."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from celery_singleton_lock.engine import absent_reads
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.lease import LockHolder
from celery_singleton_lock.engine.postgres.connections import Connections, Row, where
from celery_singleton_lock.engine.postgres.parked_reading import ParkedReads
from celery_singleton_lock.engine.postgres.statements import Statements
from celery_singleton_lock.errors import LockBackendUnavailable


def holder_of(key: str, row: Row) -> LockHolder:
    """The holder that ``row`` (``fence, pid, host, task_id, acquired_at, seconds left``)
    names, under the lock ``key``."""
    fence, pid, host, task_id, acquired_at, left = row
    return LockHolder(
        key=key,
        task_id=task_id or "",
        host=host or "",
        pid=pid,
        acquired_at=acquired_at,
        fence=fence,
        ttl=None if left is None else max(0.0, float(left)),
    )


class PostgresInspector:
    """Reads the locks under ``prefix`` in the tables of ``statements``."""

    def __init__(
        self,
        connections: Connections,
        statements: Statements,
        prefix: str,
        parked_reads: ParkedReads,
    ) -> None:
        self.prefix = prefix
        self._connections = connections
        self._statements = statements
        # the calls parked behind the locks (policies queue, replace): parked_reading.py
        self.parked = parked_reads.parked
        self.waiting_newest = parked_reads.waiting_newest
        self.parked_counts = parked_reads.parked_counts

    def _key(self, name: str) -> str:
        return LockKeys.build(self.prefix, name).lock

    def read(self, name: str) -> Optional[LockHolder]:
        """The live holder of lock ``name``, or None when it is free."""
        key = self._key(name)
        rows = self._connections.run(
            self._statements.read, {"prefix": self.prefix, "name": name}, key
        )
        return holder_of(key, rows[0][1:]) if rows else None

    def holders(self, name: str, limit: int) -> list[LockHolder]:
        """The holder of ``name`` (one slot here: its capabilities refuse more)."""
        holder = self.read(name)
        return [] if holder is None else [holder]

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

    # the parts this backend does not have read as none (see engine/absent_reads.py)
    rate_use = absent_reads.no_rate_use
    queued_names = absent_reads.no_queued_names

    def scan(self, count: int = 500) -> Iterator[LockHolder]:
        """Every live lease under the prefix, by name, ``count`` rows per SELECT."""
        after = ""
        while True:
            rows = self._connections.run(
                self._statements.scan,
                {"prefix": self.prefix, "after": after, "count": count},
                self.prefix,
            )
            for row in rows:
                yield holder_of(self._key(row[0]), row[1:])
            if len(rows) < count:
                return
            after = rows[-1][0]
