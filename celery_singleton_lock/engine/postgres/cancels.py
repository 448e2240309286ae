"""Cancel flags on PostgreSQL (policy ``restart``): the newest call of a lock flags the task id
of its running holder in ``singleton_lock_cancels``; the holder's body and its worker's main
process read the flag (one statement for all of a process's restartable locks), as
:class:`~..kinds.cancels.Cancels` does on Redis."""

from __future__ import annotations

from typing import Optional, Sequence

from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.kinds.cancels import CANCEL_FLAG_TTL
from celery_singleton_lock.engine.postgres.connections import Connections
from celery_singleton_lock.engine.postgres.queue_statements import QueueStatements


class PostgresCancels:
    """The cancel flags of the locks under ``prefix`` (a :class:`~..backend.CancelFlags`)."""

    def __init__(self, connections: Connections, statements: QueueStatements, prefix: str) -> None:
        self.connections = connections
        self.statements = statements
        self.prefix = prefix

    def cancel_holder(self, name: str, by: str) -> Optional[str]:
        """Ask the running holder of lock ``name`` to stop, for the call ``by`` (never flagged
        itself); its task id, or None when no running call holds the lock."""
        params = {
            "prefix": self.prefix,
            "name": name,
            "by": by,
            "ttl_ms": int(CANCEL_FLAG_TTL * 1000),
        }
        key = LockKeys.build(self.prefix, name).lock
        rows = self.connections.run(self.statements.cancel_holder, params, key)
        return str(rows[0][0]) if rows else None

    def cancel_requested(self, held: Sequence[tuple[str, str]]) -> list[bool]:
        """For each ``(lock name, task id)``: whether that call was asked to stop (one
        statement for all)."""
        if not held:
            return []
        params = {
            "prefix": self.prefix,
            "names": [name for name, _ in held],
            "task_ids": [task_id for _, task_id in held],
        }
        rows = self.connections.run(self.statements.cancel_requested, params, self.prefix)
        return [bool(flag) for (flag,) in rows]
