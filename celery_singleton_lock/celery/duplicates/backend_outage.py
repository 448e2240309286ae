"""What a call does when the lock server cannot be asked in ``before_start``: the task's
``lock_on_backend_error`` (``retry``, ``run`` or ``fail``), applied in one place."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery_singleton_lock.celery.duplicates import actions
from celery_singleton_lock.celery.signals import lock_backend_error
from celery_singleton_lock.celery.task.lock_view import LockHandle
from celery_singleton_lock.celery.task.replica_pause import PAUSE
from celery_singleton_lock.engine import LockHolder
from celery_singleton_lock.errors import LockBackendUnavailable, ReplicasUnavailable

if TYPE_CHECKING:
    from celery_singleton_lock.celery.config.resolution import LockOptions

log = logging.getLogger("celery_singleton_lock.acquire")


def on_backend_unavailable(
    task: Any, exc: LockBackendUnavailable, name: str, options: LockOptions, request: Any
) -> None:
    """Return to run the body without the lock (``run``: ``request.lock`` says so); otherwise
    end the execution (a lock retry later, or the error for an eager call). ``task``: the
    ``LockedTask`` (not imported: it imports this module)."""
    if lock_backend_error.receivers:
        lock_backend_error.send(sender=task, task_id=request.id, key=exc.key or name, error=exc)
    if options.on_backend_error == "run":
        log.error("task %s[%s]: %s; running WITHOUT the lock", task.name, request.id, exc)
        request.lock = LockHandle(exc.key, None, locked=False)
        if task.lock_track_started:
            task._store_started(request.id, request)
        return
    if request.is_eager:
        # apply() callers get the error now rather than a retry loop
        raise LockBackendUnavailable(
            f"task {task.name}[{request.id}]: {exc.message}", exc.key
        ) from exc
    if isinstance(exc, ReplicasUnavailable):
        PAUSE.refused_one(task, request.id, exc)  # said once, not per task
    else:
        log.error("task %s[%s]: %s; retrying later", task.name, request.id, exc)
    unknown = LockHolder.unknown(exc.key or name)
    actions.retry(actions.Duplicate(task, request, options, name, unknown), exc)
