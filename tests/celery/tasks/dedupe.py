"""Tasks with ``dedupe_on_enqueue`` (tests/celery/test_enqueue_dedupe.py, test_until_started.py,
test_enqueue_dedupe_processes.py); ``dedupe_gated`` blocks until the test opens its gate
(:func:`~tests.celery.tasks.core.open_gate`)."""

from __future__ import annotations

from celery_singleton_lock import LockedTask
from tests.celery.tasks.core import app, gated_body, store


@app.task(bind=True, base=LockedTask, lock_on=("key",), dedupe_on_enqueue=True, lock_ttl=5)
def dedupe_gated(self: LockedTask, key: str) -> str:
    return gated_body(key, self.request.id)


@app.task(
    bind=True,
    base=LockedTask,
    lock_on=("key",),
    dedupe_on_enqueue=True,
    on_duplicate="retry",
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.2,
)
def dedupe_lock_retry(self: LockedTask, key: str) -> str:
    store().rpush(f"runs:{key}", str(self.request.id))
    return str(self.request.id)


@app.task(bind=True, base=LockedTask, lock_on=("key",), dedupe_on_enqueue=True, max_retries=3)
def dedupe_retries_itself(self: LockedTask, key: str) -> int:
    store().rpush(f"runs:{key}", str(self.request.id))
    if self.request.retries < 1:
        raise self.retry(countdown=0.1)
    return int(self.request.retries)


@app.task(
    bind=True,
    base=LockedTask,
    lock_on=("key",),
    dedupe_on_enqueue="until_started",
    on_duplicate="retry",
    lock_retry_backoff=0.2,
    lock_retry_backoff_max=0.5,
)
def dedupe_until_started(self: LockedTask, key: str) -> str:
    return gated_body(key, self.request.id)
