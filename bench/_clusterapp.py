"""The app of ``bench cluster``'s ``celery worker`` processes: one no-op ``LockedTask``.

Configured from the environment that ``tests/celery/workers.py`` gives its workers
(``CSL_BROKER_URL``, ``CSL_LOCK_URL``): the lock URL is a single server's or one node of a
Redis Cluster (the worker finds out which). ``acks_late``: a message is acknowledged once its
task has ended, so an empty queue with nothing unacknowledged means every task has run.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_singleton_lock.celery import LockedTask

app = Celery("bench_cluster")
app.conf.update(
    broker_url=os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6379/0"),
    singleton_lock_url=os.environ.get("CSL_LOCK_URL"),
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
)


@app.task(base=LockedTask, name="bench_cluster.noop")  # type: ignore[untyped-decorator]
def noop(i: int) -> None:
    """Locked on ``i``: every call takes and releases a lock of its own."""
