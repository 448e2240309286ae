"""Locked work paused for want of replicas (``lock_min_replicas``), said once, not per task.

With ``lock_min_replicas=1`` and one replica, a failover leaves the promoted replica with no
replica of its own: every acquire is written, not acknowledged, released again and retried,
and that lasts until a replica is attached again: it does not end by itself. One ERROR says so
when the first acquire of this process is refused, with what to do; the refusals after it are
logged at DEBUG only; one WARNING says when an acquire succeeds again and how many were retried
meanwhile. Per process (each prefork child says it once).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("celery_singleton_lock.acquire")


class ReplicaPause:
    """Whether this process's acquires are being refused for want of replicas, and how many."""

    def __init__(self) -> None:
        #: True from the first refused acquire to the next acquire that succeeds; read on the
        #: hot path without the lock (a stale read costs one late or early line, no more)
        self.active = False
        self.refused = 0
        self._lock = threading.Lock()

    def refused_one(self, task: Any, task_id: str, error: Exception) -> None:
        """An acquire of ``task`` was refused (``ReplicasUnavailable``); it retries later."""
        with self._lock:
            first = not self.active
            self.active = True
            self.refused += 1
        if not first:
            log.debug("task %s[%s]: %s; retrying later (paused)", task.name, task_id, error)
            return
        log.error(
            "locked tasks with lock_min_replicas=%s are PAUSED: %s. Their acquires retry until "
            "the lock server has that many replicas attached again; this does not end by "
            "itself (after a failover the promoted replica has no replica until one is "
            "attached). Said once; a WARNING says when it ends",
            task.lock_options.min_replicas,
            error,
        )

    def resumed(self) -> None:
        """An acquire succeeded: if paused, say once that locked work goes on."""
        with self._lock:
            if not self.active:
                return
            refused, self.refused, self.active = self.refused, 0, False
        log.warning(
            "locked tasks RESUMED: replicas acknowledge locks again (%d acquire(s) were retried "
            "while paused)",
            refused,
        )


#: The one pause of this process.
PAUSE = ReplicaPause()
