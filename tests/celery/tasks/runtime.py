"""Tasks that look at the lock they run under, and acquires the lock server cannot grant
(tests/celery/test_runtime.py; ``watches_its_lock`` and ``fenced`` serve test_events.py,
test_metrics.py and test_trace_events.py too, ``paused_without_replica``
test_replica_pause.py, ``gated`` test_metrics_waits_and_outages.py)."""

from __future__ import annotations

import time
from typing import Any, Optional

from celery_singleton_lock import LockedTask, LockLostError
from tests.celery.tasks.core import REPLICAS, app, gated_body, store


@app.task(bind=True, base=LockedTask, lock_on=("key",), lock_ttl=5)
def gated(self: LockedTask, key: str) -> str:
    """Holds its lock until the test opens its gate (:func:`~tests.celery.tasks.core.open_gate`)."""
    return gated_body(key, self.request.id)


@app.task(bind=True, base=LockedTask, lock_on=("key",))
def reentrant(self: LockedTask, key: str, depth: int) -> list[int]:
    store().incr(f"reentrant:{key}")
    if depth == 0:
        return [0]
    inner = self.apply(args=(key, depth - 1), throw=True)
    return [depth, *inner.get()]


@app.task(bind=True, base=LockedTask, lock_ttl=0.6)
def watches_its_lock(self: LockedTask, key: str) -> dict[str, Any]:
    """Deletes its own lock key (as a takeover would), then waits to be told it is lost."""
    handle = self.request.lock
    store().delete(handle.key)
    deadline = time.monotonic() + 5
    while not handle.lost and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        handle.check()
        raised = False
    except LockLostError as exc:
        raised = type(exc).__name__
    return {"lost": handle.lost, "check_raised": raised}


@app.task(bind=True, base=LockedTask, lock_fencing=True, lock_on=("account",))
def fenced(self: LockedTask, account: str) -> Optional[int]:
    return self.request.lock.fence  # type: ignore[no-any-return]


@app.task(bind=True, base=LockedTask, lock_on_backend_error="run")
def runs_unlocked(self: LockedTask, key: str) -> bool:
    return bool(self.request.lock.locked)


@app.task(bind=True, base=LockedTask, lock_retry_backoff=0.2, lock_retry_backoff_max=0.5)
def retries_on_outage(self: LockedTask, key: str) -> str:
    return "ran"


@app.task(bind=True, base=LockedTask)
def reports_its_state(self: LockedTask, key: str) -> str:
    return str(self.backend.get_task_meta(self.request.id)["status"])


@app.task(
    bind=True,
    base=LockedTask,
    lock_on=("key",),
    lock_min_replicas=REPLICAS,
    lock_min_replicas_timeout=0.05,
)
def needs_a_replica(self: LockedTask, key: str) -> str:
    """Holds its lock only once a replica has it: the test lock server has none."""
    return "ran"


@app.task(
    bind=True,
    base=LockedTask,
    lock_on=("key",),
    lock_min_replicas=REPLICAS,
    # 0.5 s, not 0.05: a replica that has just attached may take longer than 50 ms to
    # acknowledge, and each such acquire would pause (and log) again
    lock_min_replicas_timeout=0.5,
    lock_retry_backoff=0.1,
    lock_retry_backoff_max=0.2,
)
def paused_without_replica(self: LockedTask, key: str) -> str:
    """``needs_a_replica`` with a short lock-retry backoff: retries until a replica is attached."""
    return "ran"
