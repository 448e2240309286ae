"""Live rules on PostgreSQL: the cap only (``celery locks limit``), a row per family's cap key
(:func:`...keys.cap_key`) in the schema's caps table, read by the slot function (:mod:`.slots`).
A pause is not kept here, so these rules are not :class:`...backend.PausingRules`."""

from __future__ import annotations

from typing import Callable, Optional

from celery_singleton_lock.engine.backend import LiveRule
from celery_singleton_lock.engine.keys import cap_key
from celery_singleton_lock.engine.postgres.connections import Connections
from celery_singleton_lock.engine.postgres.schema import Schema


class PostgresLiveRules:
    """The live caps of the families under ``prefix`` in the tables of ``schema``; ``ready``
    makes them if they are missing."""

    def __init__(
        self, connections: Connections, schema: Schema, prefix: str, ready: Callable[[], None]
    ) -> None:
        self._connections = connections
        self._ready = ready
        self.prefix = prefix
        self._read = f"SELECT cap FROM {schema.caps} WHERE key = %(key)s"
        self._every = (
            f"SELECT key, cap FROM {schema.caps} WHERE starts_with(key, %(start)s) "
            "ORDER BY key LIMIT %(limit)s"
        )
        self._write = (
            f"INSERT INTO {schema.caps} (key, cap) VALUES (%(key)s, %(cap)s) "
            "ON CONFLICT (key) DO UPDATE SET cap = excluded.cap"
        )
        self._delete = f"DELETE FROM {schema.caps} WHERE key = %(key)s"

    def key(self, family: str) -> str:
        """The cap's key of ``family`` (a task's or group's name)."""
        return cap_key(self.prefix, family)

    def read(self, family: str) -> LiveRule:
        """``family``'s live cap now (never paused here)."""
        self._ready()
        key = self.key(family)
        rows = self._connections.run(self._read, {"key": key}, key)
        return LiveRule(int(rows[0][0]) if rows else None, None)

    def set_cap(self, family: str, cap: Optional[int]) -> None:
        """Set ``family``'s live cap (None: remove it, the declared limit holds)."""
        self._ready()
        key = self.key(family)
        sql = self._delete if cap is None else self._write
        self._connections.run(sql, {"key": key, "cap": cap}, key)

    def every(self, limit: int = 1000) -> dict[str, LiveRule]:
        """The families with a live cap, by family (at most ``limit``)."""
        self._ready()
        start = self.key("")
        rows = self._connections.run(self._every, {"start": start, "limit": limit}, start)
        return {str(key)[len(start) :]: LiveRule(int(cap), None) for key, cap in rows}
