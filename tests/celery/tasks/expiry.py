"""Tasks for real worker processes killed or stalled on purpose: short lock TTLs, late
acknowledgement, redelivery (tests/celery/test_real_workers.py; ``short_ttl_retry`` serves
test_cluster.py and test_sentinel.py, ``late_ack_retry`` the chaos suite)."""

from __future__ import annotations

import os
import time
from typing import Any

from celery_singleton_lock import LockedTask
from tests.celery.tasks.core import REPLICAS, keyed_task, store


class RecordsAttempts(LockedTask):
    """Records every delivery that reaches ``before_start`` in ``attempts:<key>``, as
    "task_id|pid|time|redelivered|lock_retries", before the lock is tried."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        from celery_singleton_lock.celery.duplicates.redelivery import lock_retries

        key = kwargs["key"] if "key" in kwargs else args[0]
        info = self.request.delivery_info or {}
        store().rpush(
            f"attempts:{key}",
            f"{task_id}|{os.getpid()}|{time.time()}|{int(bool(info.get('redelivered')))}"
            f"|{lock_retries(self.request)}",
        )
        super().before_start(task_id, args, kwargs)


#: lock_ttl of short_ttl. Its only renewer (threads, solo, gevent pools) renews every third of
#: it, so the key outlives a renewer kept off the CPU for two thirds of it: with 1 s (0.67 s of
#: slack) a worker on a loaded 2-core machine lost its lock under a running body.
SHORT_TTL = 2
short_ttl = keyed_task(__name__, "short_ttl", lock_ttl=SHORT_TTL, on_duplicate="skip")
long_short_ttl = keyed_task(
    __name__,
    "long_short_ttl",
    seconds=30,
    lock_ttl=2,
    on_duplicate="retry",
    lock_retry_backoff=0.1,
    lock_retry_backoff_max=0.5,
)
short_ttl_retry = keyed_task(
    __name__,
    "short_ttl_retry",
    lock_ttl=1,
    on_duplicate="retry",
    lock_retry_backoff=0.1,
    lock_retry_backoff_max=0.5,
)
#: short_ttl_retry held only once a replica acknowledged it (test_sentinel.py's second stream)
short_ttl_retry_replicated = keyed_task(
    __name__,
    "short_ttl_retry_replicated",
    lock_ttl=1,
    on_duplicate="retry",
    lock_retry_backoff=0.1,
    lock_retry_backoff_max=0.5,
    lock_min_replicas=REPLICAS,
)
late_ack_skip = keyed_task(
    __name__,
    "late_ack_skip",
    seconds=6,
    base=RecordsAttempts,
    acks_late=True,
    lock_ttl=2,
    on_duplicate="skip",
)
late_ack_retry = keyed_task(
    __name__,
    "late_ack_retry",
    seconds=6,
    base=RecordsAttempts,
    acks_late=True,
    lock_ttl=2,
    on_duplicate="retry",
    lock_retry_backoff=0.1,
    lock_retry_backoff_max=0.5,
)
late_ack_forgetful = keyed_task(
    __name__,
    "late_ack_forgetful",
    base=RecordsAttempts,
    acks_late=True,
    lock_ttl=2,
    lock_finished_ttl=None,
)
