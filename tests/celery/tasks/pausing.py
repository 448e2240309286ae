"""Tasks a pause stops (tests/celery/test_pause.py): ``celery locks pause`` / ``resume`` and a
body's ``self.request.lock.pause_for``. A pause stops every call of its task (or group),
whatever the arguments: each test pauses a task of its own, so that tests sharing workers never
pause each other's calls.

Their body records, as :func:`~tests.celery.tasks.limits.limited_body` does, its start under
``runs:<key>`` (``task id|pid|time``).
"""

from __future__ import annotations

from typing import Any

from celery_singleton_lock import LockedTask
from tests.celery.tasks.core import app
from tests.celery.tasks.limits import limited_body, limited_task
from tests.celery.tasks.queueing import QUEUE

#: a mutex whose duplicates are skipped (a beat job): the plain SET NX PX path
paused_skip = limited_task("paused_skip", on_duplicate="skip", lock_ttl=10)
#: parked behind two slots: a pause parks every call, resume hands their slots on
paused_queue = limited_task("paused_queue", lock_limit=2, on_duplicate=QUEUE, lock_ttl=10)
#: the same, paused ``--for`` some seconds: the pause ends by itself
paused_queue_for = limited_task("paused_queue_for", lock_limit=2, on_duplicate=QUEUE, lock_ttl=10)
#: retried while paused, from after the pause's end
paused_retry = limited_task(
    "paused_retry", on_duplicate="retry", lock_ttl=10, lock_retry_backoff=0.2
)


@app.task(
    bind=True,
    base=LockedTask,
    name=f"{__name__}.rate_limited_api",
    lock_on=("key",),
    lock_limit=4,
    on_duplicate=QUEUE,
    lock_ttl=10,
)
def rate_limited_api(self: LockedTask, key: str, pause: float = 0.0) -> dict[str, Any]:
    """A call of an API: told 429 with Retry-After ``pause`` (> 0), it pauses every start of
    the task, for every key, on every worker."""
    if pause:
        self.request.lock.pause_for(pause)
    return limited_body(self, key, 0.0)


#: one slot, calls parked by their message's priority (tests pause it to park them all first)
paused_by_priority = limited_task("paused_by_priority", on_duplicate=QUEUE, lock_ttl=10)


@app.task(
    bind=True,
    base=LockedTask,
    name=f"{__name__}.paused_fair_by_priority",
    lock_on=("key",),
    on_duplicate=QUEUE,
    # a Redis Cluster's workers serve "retry" here (QUEUE), where nothing is parked to be fair
    lock_fair_by=("tenant",) if QUEUE == "queue" else None,
    lock_ttl=10,
)
def paused_fair_by_priority(self: LockedTask, key: str, tenant: str) -> dict[str, Any]:
    """One slot per key; parked calls served round robin across tenants, each tenant's turn
    to its call of the highest priority (tests pause it to park them all first)."""
    return limited_body(self, key, 0.0)


#: the newest call wins (tests/celery/test_pause_latest.py): while paused none starts, not even
#: the one a release handed the lock to; the newest runs after the pause
paused_replace = limited_task("paused_replace", on_duplicate="replace", lock_ttl=10)
#: the same, stopping the running call for the newest (terminated after 1 s of grace)
paused_restart = limited_task(
    "paused_restart", on_duplicate="restart", lock_ttl=10, lock_cancel_grace=1
)
#: one slot, parked while paused: its worker logs why it parked
paused_queue_log = limited_task("paused_queue_log", on_duplicate=QUEUE, lock_ttl=10)
