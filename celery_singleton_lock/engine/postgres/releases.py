"""Waiting for a release on PostgreSQL: ``LISTEN`` on the schema's release channel, on a
connection of the subscription's own (a session: ``LISTEN`` needs one, so through PgBouncer in
transaction mode it hears nothing and a waiter wakes at the holder's TTL instead).

A release NOTIFYs the lock key in its own transaction (see :mod:`.statements`), so a waiter
that listens before it reads the lock again misses no release.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Optional

import psycopg

from celery_singleton_lock.engine.postgres.connections import Connection, Connections, unavailable


class PostgresSubscription:
    """A subscription to the release of one lock (a :class:`~..backend.ReleaseSubscription`)."""

    def __init__(self, connections: Connections, channel: str, key: str) -> None:
        self._key = key
        self._conninfo = connections.conninfo
        try:
            self._connection: Optional[Connection] = connections.connect()
            self._connection.execute(f'LISTEN "{channel}"')
        except psycopg.Error as exc:
            self.close()
            raise unavailable(exc, self._conninfo, key) from exc

    def get_message(
        self, ignore_subscribe_messages: bool = False, timeout: float = 0.0
    ) -> Optional[dict[str, Any]]:
        """The release of the lock, as a pub/sub message, if one comes within ``timeout``
        seconds (releases of other locks on the channel are passed over); else None."""
        connection = self._connection
        if connection is None:
            return None
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = max(0.0, deadline - time.monotonic())
                for notify in connection.notifies(timeout=left, stop_after=1):
                    if notify.payload == self._key:
                        return {"type": "message", "channel": notify.channel, "data": self._key}
                if time.monotonic() >= deadline:
                    return None
        except psycopg.Error as exc:
            raise unavailable(exc, self._conninfo, self._key) from exc

    def close(self) -> None:
        connection, self._connection = getattr(self, "_connection", None), None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()
