"""Tasks of the one lock scope: every path after the acquire ends in a release
(tests/celery/test_lock_scope.py; its class-based task, ``SyncAccount``, is registered by
:func:`~tests.celery.tasks.core.configure`)."""

from __future__ import annotations

import time
from typing import Any

from celery_singleton_lock import LockedTask
from tests.celery.tasks.core import app, store


class FailsAfterItsLock(LockedTask):
    """``before_start`` fails after the lock is taken whenever ``setup-fails:<key>`` exists
    (as a subclass's own set-up, or a result backend storing STARTED, can fail)."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        super().before_start(task_id, args, kwargs)
        if store().exists(f"setup-fails:{args[0]}"):
            raise RuntimeError("set-up failed after the lock was taken")


@app.task(bind=True, base=FailsAfterItsLock, lock_on=("key",))
def fails_after_its_lock(self: LockedTask, key: str) -> dict[str, Any]:
    handle = self.request.lock
    return {"reentrant": handle.reentrant, "key_held": bool(store().exists(handle.key))}


@app.task(bind=True, base=LockedTask, lock_on=("key",))
def corrupts_its_lock(self: LockedTask, key: str) -> str:
    """Replaces its own lock key with a hash: the release then finds no lock of ours there."""
    lock = self.request.lock.key
    store().delete(lock)
    store().hset(lock, "foreign", "data")
    return "body done"


@app.task(bind=True, base=LockedTask, lock_on=("key",), time_limit=1, lock_ttl=0.6)
def outlives_its_time_limit(self: LockedTask, key: str) -> dict[str, Any]:
    """Runs past its hard time limit on a pool that does not enforce it (threads)."""
    handle = self.request.lock
    deadline = time.monotonic() + 4
    while not handle.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"lost": handle.lost, "key_exists": bool(store().exists(handle.key))}
