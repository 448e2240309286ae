"""Reading the calls parked on PostgreSQL (policies ``queue`` and ``replace``), for the
backend's :class:`~.reading.PostgresInspector`: who is parked behind a lock, how many, the
call waiting as the newest, and the locks with parked calls. A schema no process of this
version has used has no parked tables: nothing was parked there, and that is what they read."""

from __future__ import annotations

from typing import Optional

from celery_singleton_lock.engine.postgres.connections import Connections
from celery_singleton_lock.engine.postgres.queue_statements import QueueStatements


class ParkedReads:
    """Reads of the calls parked behind the locks under ``prefix``."""

    def __init__(self, connections: Connections, statements: QueueStatements, prefix: str) -> None:
        self.prefix = prefix
        self._connections = connections
        self._statements = statements

    def parked(self, name: str) -> list[str]:
        """The task ids parked behind lock ``name``, in the order they are handed it."""
        rows = self._connections.read(
            self._statements.parked_ids, {"prefix": self.prefix, "name": name}, name
        )
        return [str(task_id) for (task_id,) in rows]

    def waiting_newest(self, name: str) -> Optional[tuple[str, Optional[float]]]:
        """For a lock whose newest call wins: the task id of the call waiting and, with a
        debounce, when it is due (epoch seconds by the server's clock); None for any other
        lock, or when none waits."""
        rows = self._connections.read(
            self._statements.waiting_newest, {"prefix": self.prefix, "name": name}, name
        )
        return (str(rows[0][0]), rows[0][1]) if rows else None

    def parked_counts(self, lock_keys: list[str]) -> list[int]:
        """How many calls are parked behind each of ``lock_keys`` (full lock keys,
        ``prefix:{name}``), in one statement."""
        if not lock_keys:
            return []
        start = len(self.prefix) + 2
        names = [key[start:-1] for key in lock_keys]
        rows = self._connections.read(
            self._statements.parked_counts, {"prefix": self.prefix, "names": names}, self.prefix
        )
        return [int(count) for (count,) in rows]

    def parked_locks(self, limit: int = 10_000) -> list[tuple[str, int, bool]]:
        """``(lock name, calls parked, lock held)`` of at most ``limit`` locks with calls
        parked (by name), from the parked rows in one statement: no index to keep, as the
        hand-off index is on Redis. A lock reserved for a handed call counts as held."""
        rows = self._connections.read(
            self._statements.parked_locks, {"prefix": self.prefix, "limit": limit}, self.prefix
        )
        return [(str(name), int(count), bool(held)) for name, count, held in rows]
