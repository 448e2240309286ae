"""The Celery app of the Redlock quorum worker tests (tests/celery/test_quorum_workers.py).

Its own app, not ``lockapp``: a quorum refuses fencing, enqueue dedupe and replica
acknowledgement at registration, which ``lockapp`` registers. Configured from the environment:
CSL_BROKER_URL, CSL_BACKEND_URL, CSL_LOCK_URLS (the quorum's URLs, comma-separated; the app
setting gets them as a list), CSL_RECORDS_URL (where bodies record what they do), CSL_QUEUE.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import redis
from celery import Celery

from celery_singleton_lock import LockedTask
from tests.support import broker_polling

app = Celery("quorumapp")

if os.environ.get("CSL_BROKER_URL"):
    app.conf.update(
        broker_url=os.environ["CSL_BROKER_URL"],
        result_backend=os.environ["CSL_BACKEND_URL"],
        singleton_lock_url=os.environ["CSL_LOCK_URLS"].split(","),
        broker_connection_retry_on_startup=True,
        broker_transport_options=broker_polling(),
        worker_prefetch_multiplier=1,
        result_expires=600,
        task_default_queue=os.environ.get("CSL_QUEUE", "celery"),
        # a stopped lock server must not hold an acquire for long
        singleton_lock_redis_options={"socket_timeout": 1.0, "socket_connect_timeout": 0.5},
    )

_records: Optional[redis.Redis] = None
_records_pid = 0


def records() -> redis.Redis:
    global _records, _records_pid
    if _records is None or _records_pid != os.getpid():
        _records = redis.Redis.from_url(os.environ["CSL_RECORDS_URL"], socket_timeout=5)
        _records_pid = os.getpid()
    return _records


@app.task(
    bind=True,
    base=LockedTask,
    lock_on=("key",),
    on_duplicate="retry",
    lock_ttl=1,
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.5,
)
def quorum_retry(self: LockedTask, key: str, seconds: float) -> dict[str, Any]:
    """Records its run in ``runs:<key>`` ("task_id|pid|time") and counts bodies inside the
    lock at once (``gauge:<key>``, ``overlaps:<key>``)."""
    r = records()
    if r.incr(f"gauge:{key}") > 1:
        r.incr(f"overlaps:{key}")
    r.rpush(f"runs:{key}", f"{self.request.id}|{os.getpid()}|{time.time()}")
    try:
        time.sleep(seconds)
    finally:
        r.decr(f"gauge:{key}")
    return {"key": key}


@app.task(bind=True, base=LockedTask, lock_on=("key",), lock_ttl=60)
def quorum_hold(self: LockedTask, key: str, seconds: float) -> None:
    """Records its run in ``runs:<key>`` ("task_id|pid|time"), holds its lock (a TTL of a
    minute: a lock still there after a shutdown was not released) for ``seconds``, then
    records its end in ``ends:<key>`` (a body cut short by its process's end records none)."""
    records().rpush(f"runs:{key}", f"{self.request.id}|{os.getpid()}|{time.time()}")
    for _ in range(int(seconds * 10)):
        time.sleep(0.1)
    records().rpush(f"ends:{key}", f"{self.request.id}|{time.time()}")
