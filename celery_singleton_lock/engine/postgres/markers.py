"""Queued markers on PostgreSQL (``dedupe_on_enqueue``): one row per lock name in the schema's
queued table (:mod:`.schema`), the task id of the one message queued under it and until when,
written before the message is published and deleted by its acquire (``take_queued``, in the
acquire's own statement: :meth:`PostgresMarkers.acquire_sql`). The same contract as the
Redis markers (lua/enqueue.lua, lua/clear_queued.lua), each operation one statement.

Two enqueues racing for one name: the insert of the second waits for the first's row and then
reads it (``ON CONFLICT DO UPDATE`` sees the newest version), so it answers the first's task
id, never publishes beside it.
"""

from __future__ import annotations

from typing import Callable, Optional

from celery_singleton_lock.engine.postgres.connections import Connections
from celery_singleton_lock.engine.postgres.schema import Schema
from celery_singleton_lock.engine.postgres.statements import Statements

#: ``resend``/``running`` of :meth:`PostgresMarkers.enqueue` as the statement's mode (the
#: modes of lua/enqueue.lua's ARGV[3])
_RUNNING_TOO, _RESEND, _QUEUED_ONLY = "0", "1", "2"


class PostgresMarkers:
    """The queued markers under ``prefix`` in the tables of ``schema``; ``ready`` makes
    them if they are missing."""

    def __init__(
        self,
        connections: Connections,
        schema: Schema,
        statements: Statements,
        prefix: str,
        ready: Callable[[], None],
    ) -> None:
        self._connections = connections
        #: creates the tables if not known to exist: an enqueue may come before any acquire
        self._ready = ready
        self._prefix = prefix
        leases, queued = schema.leases, schema.queued
        #: The marker of the name, unless another live one is there (its id answered, for a
        #: resend too) or, in mode '0', a live lease of another task id (that id answered,
        #: nothing written). A marker of the same id, or one run out, is written over.
        self._enqueue = f"""
WITH marker AS (
    SELECT q.task_id FROM {queued} q
    WHERE q.prefix = %(prefix)s AND q.name = %(name)s AND q.until > now()
), running AS (
    SELECT h.task_id FROM {leases} h
    WHERE %(mode)s = '{_RUNNING_TOO}' AND h.prefix = %(prefix)s AND h.name = %(name)s
        AND h.lease_until > now() AND h.task_id NOT IN ('', %(task_id)s)
        AND NOT EXISTS (SELECT 1 FROM marker)
), written AS (
    INSERT INTO {queued} AS q (prefix, name, task_id, until)
    SELECT %(prefix)s, %(name)s, %(task_id)s, now() + %(ttl_ms)s * interval '1 millisecond'
    WHERE NOT EXISTS (SELECT 1 FROM running)
    ON CONFLICT (prefix, name) DO UPDATE SET
        task_id = CASE WHEN q.until <= now() OR q.task_id = excluded.task_id
            THEN excluded.task_id ELSE q.task_id END,
        until = CASE WHEN q.until <= now() OR q.task_id = excluded.task_id
            THEN excluded.until ELSE q.until END
    RETURNING q.task_id
)
SELECT (SELECT task_id FROM running), (SELECT task_id FROM written)"""
        #: Delete the name's live marker (with ``task_id``: only if it holds that id); a
        #: marker run out is deleted too, but not counted.
        self._clear = f"""
DELETE FROM {queued}
WHERE prefix = %(prefix)s AND name = %(name)s
    AND (%(task_id)s::text IS NULL OR task_id = %(task_id)s)
RETURNING until > now()"""
        #: The name's live marker: its task id and seconds left.
        self._queued = f"""
SELECT task_id, extract(epoch FROM until - now())::float8 FROM {queued}
WHERE prefix = %(prefix)s AND name = %(name)s AND until > now()"""
        self.acquire_sql = self._taking_queued(statements.acquire, queued, leases)

    @staticmethod
    def _taking_queued(acquire: str, queued: str, leases: str) -> str:
        """The acquire statement (statements.py) that also deletes the name's marker if it
        holds the owner's task id, in the same transaction: whatever the outcome, or (with
        ``queued_while_held``) unless another owner holds the lock: a call sent again (policy
        retry) stays queued, so no duplicate is published before its resend (as
        lua/acquire.lua's ARGV[6]). Its CTE goes after the acquire's last one (``taken``)."""
        head, answer, tail = acquire.partition("\nSELECT 'acquired'")
        assert answer, "the acquire statement's answer moved: place the marker's CTE again"
        unqueued = f""", unqueued AS (
    DELETE FROM {queued} q
    WHERE q.prefix = %(prefix)s AND q.name = %(name)s AND q.task_id = %(task_id)s
        AND (NOT %(queued_while_held)s OR EXISTS (SELECT 1 FROM taken)
            OR (SELECT finished FROM done)
            OR NOT EXISTS (SELECT 1 FROM {leases} h WHERE h.prefix = %(prefix)s
                AND h.name = %(name)s AND h.lease_until > now() AND h.token <> %(token)s))
)"""
        return head + unqueued + answer + tail

    def enqueue(
        self, name: str, task_id: str, ttl: float, *, resend: bool = False, running: bool = True
    ) -> Optional[str]:
        """Mark ``task_id`` as queued under the lock ``name``, unless another message is
        queued or an execution is running there; in one statement. As the Redis markers'
        (:meth:`~..kinds.markers.Markers.enqueue`): None to publish, else the task id queued
        or running (nothing written).

        Raises:
            LockBackendUnavailable: the database could not be reached.
        """
        if not task_id:
            raise ValueError("enqueue needs a task id")
        self._ready()
        mode = _RESEND if resend else (_RUNNING_TOO if running else _QUEUED_ONLY)
        params = {
            "prefix": self._prefix,
            "name": name,
            "task_id": task_id,
            "ttl_ms": max(1, int(ttl * 1000)),
            "mode": mode,
        }
        rows = self._connections.run(self._enqueue, params, name)
        holder, marker = rows[0] if rows else (None, None)
        if holder is not None:
            return str(holder)
        if resend or marker is None or marker == task_id:
            return None
        return str(marker)

    def clear_queued(self, name: str, task_id: Optional[str] = None) -> bool:
        """Delete the queued marker of the lock ``name``; with ``task_id``, only if it holds
        exactly that id. True if a live marker was deleted."""
        self._ready()
        params = {"prefix": self._prefix, "name": name, "task_id": task_id or None}
        rows = self._connections.run(self._clear, params, name)
        return any(live for (live,) in rows)

    def queued_for(self, name: str) -> Optional[float]:
        """Seconds the queued marker of the lock ``name`` still lives; None without one."""
        self._ready()
        rows = self._connections.run(self._queued, {"prefix": self._prefix, "name": name}, name)
        return max(0.0, float(rows[0][1])) if rows else None

    def queued(self, name: str) -> Optional[str]:
        """The task id queued under the lock ``name`` (its marker), or None."""
        self._ready()
        rows = self._connections.run(self._queued, {"prefix": self._prefix, "name": name}, name)
        return str(rows[0][0]) if rows else None
