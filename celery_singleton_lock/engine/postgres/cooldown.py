"""A cooldown after each run on PostgreSQL (``lock_cooldown``): the release leaves the row
taken for a while.

The release compares the owner's token, as a release does, then writes the row with the
token ``cooldown`` (no owner has it: tokens are 32 hex digits) and the pid -1 (no process has
it), its lease the cooldown: an acquire finds it held (by the run that just ended, its time
left the cooldown's), no one renews or releases it, and it is free when its lease runs out,
as a crashed holder's is. The release is NOTIFYed, as any release is: a waiter then reads the
row again and sleeps for the cooldown left. The same works on a slot's row (:mod:`.rows`).
"""

from __future__ import annotations

from typing import Optional

from celery_singleton_lock.engine.lease import Lease
from celery_singleton_lock.engine.postgres.connections import Connections
from celery_singleton_lock.engine.postgres.reading import COOLDOWN_PID
from celery_singleton_lock.engine.postgres.rows import announced, row_name
from celery_singleton_lock.engine.postgres.schema import Schema
from celery_singleton_lock.errors import LockError


class PostgresCooldown:
    """The cooldown release of the leases under ``prefix`` in the tables of ``schema``."""

    def __init__(self, connections: Connections, schema: Schema, prefix: str) -> None:
        self._connections = connections
        self._prefix = prefix
        self._channel = schema.channel
        #: As the release (statements.py), the row left taken for the cooldown instead of
        #: freed; the finish record written if asked; the release NOTIFYed.
        self._sql = f"""
WITH cooled AS (
    UPDATE {schema.leases} SET token = 'cooldown', pid = {COOLDOWN_PID},
        lease_until = now() + %(cooldown_ms)s * interval '1 millisecond'
    WHERE prefix = %(prefix)s AND name = %(name)s AND token = %(token)s
        AND lease_until > now()
    RETURNING 1
), remembered AS (
    INSERT INTO {schema.finished} (prefix, name, task_id, until)
    SELECT %(prefix)s, %(lock)s, %(task_id)s,
        now() + %(remember_ms)s * interval '1 millisecond'
    FROM cooled WHERE %(remember_ms)s > 0
    ON CONFLICT (prefix, name, task_id) DO UPDATE SET until = excluded.until
)
SELECT count(*), CASE WHEN count(*) > 0 THEN pg_notify(%(channel)s, %(key)s)::text END
FROM cooled"""

    def release_cooling(
        self, lease: Lease, cooldown: float, *, remember_for: Optional[float] = None
    ) -> bool:
        """Release ``lease`` (as ``release`` does, ``remember_for`` too), leaving its row taken
        for ``cooldown`` seconds: True if it was still ours (its cooldown then began), False
        if not (nothing changed).

        Raises:
            LockBackendUnavailable: the database could not be reached; the lease keeps its
                token, so the release may be sent again.
        """
        if not lease.releasing():
            return False
        keys = lease.keys
        params = {
            "prefix": self._prefix,
            "name": row_name(keys),
            "lock": keys.name,
            "token": lease.token,
            "cooldown_ms": max(1, int(cooldown * 1000)),
            "task_id": lease.owner.task_id,
            "remember_ms": 0 if not remember_for else max(1, int(remember_for * 1000)),
            "channel": self._channel,
            "key": announced(keys),
        }
        try:
            rows = self._connections.run(self._sql, params, lease.key)
        except LockError:
            lease.not_released()
            raise
        return bool(rows and rows[0][0])
