"""Live caps on PostgreSQL (``celery locks limit``): a row per cap key (:func:`...keys.cap_key`)
in the schema's caps table, read by the slot function (:mod:`.slots`)."""

from __future__ import annotations

from typing import Callable, Optional

from celery_singleton_lock.engine.postgres.connections import Connections
from celery_singleton_lock.engine.postgres.schema import Schema


class PostgresCaps:
    """The live caps in the tables of ``schema``; ``ready`` makes them if they are missing."""

    def __init__(self, connections: Connections, schema: Schema, ready: Callable[[], None]) -> None:
        self._connections = connections
        self._ready = ready
        self._read = f"SELECT cap FROM {schema.caps} WHERE key = %(key)s"
        self._write = (
            f"INSERT INTO {schema.caps} (key, cap) VALUES (%(key)s, %(cap)s) "
            "ON CONFLICT (key) DO UPDATE SET cap = excluded.cap"
        )
        self._delete = f"DELETE FROM {schema.caps} WHERE key = %(key)s"

    def cap(self, key: str) -> Optional[int]:
        """The live cap at ``key``, or None when none is set."""
        self._ready()
        rows = self._connections.run(self._read, {"key": key}, key)
        return int(rows[0][0]) if rows else None

    def set_cap(self, key: str, cap: Optional[int]) -> None:
        """Set the live cap at ``key`` to ``cap`` (None: remove it, the declared limit holds)."""
        self._ready()
        sql = self._delete if cap is None else self._write
        self._connections.run(sql, {"key": key, "cap": cap}, key)
