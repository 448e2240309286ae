"""Tasks that report what the Celery adapter (:mod:`celery_singleton_lock.celery.celery_api`)
reads from a running request, in the body and in the worker's main process
(tests/celery/test_celery_api.py)."""

from __future__ import annotations

import os
from typing import Any

from celery_singleton_lock import LockedTask
from tests.celery.tasks.core import app


@app.task(bind=True, base=LockedTask, lock_on=("key",))
def reads_its_request(self: LockedTask, key: str) -> dict[str, Any]:
    """What the Celery adapter reads from a running request."""
    from celery_singleton_lock.celery import celery_api

    return {
        "header": celery_api.header(self.request, "csl_test_header"),
        "hard_time_limit": celery_api.hard_time_limit(self.request),
        "redelivered": celery_api.is_redelivered(self.request),
        "is_current": celery_api.current_request(self) is self.request,
    }


@app.task(bind=True, base=LockedTask, lock_on=("key",))
def finds_its_worker_request(self: LockedTask, key: str) -> dict[str, Any]:
    """What the worker's main process reads from this run's Request (celery_api)."""
    from celery_singleton_lock.celery import celery_api

    mine = [r for r in celery_api.running_requests() if r.id == self.request.id]
    if not mine:
        return {"found": False}
    request = mine[0]
    return {
        "found": True,
        "task_is_this": request.task is self,
        "child_pid": celery_api.child_pid(request),
        "pid": os.getpid(),
        "hard_limit": celery_api.accepted_hard_time_limit(request),
        "accepted_at": celery_api.accepted_at(request),
        "args": list(request.args),
        "hostname": request.hostname,
    }
