"""The app of the child-kill soak (``tests/chaos/kill_soak.py``): one locked task per policy
``queue``, ``retry`` and ``skip``, with the same body.

An app of its own, configured from the environment ``tests/celery/workers.py`` gives its
workers (``CSL_BROKER_URL``, ``CSL_BACKEND_URL``, ``CSL_LOCK_URL``, ``CSL_QUEUE``), so that its
settings (a short hand-off reservation) reach no other test. Every task is
``run(ns, key, seconds)``, locked on ``key``. Its body records, in the lock server:

- ``<ns>:starts``: one ``task_id|key|pid|time`` per body start;
- ``<ns>:ends``: one ``task_id|time`` per body end (a killed body has none);
- ``<ns>:running``: hash pid -> task id of the bodies running now (the soak kills among them).
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import redis
from celery import Celery

from celery_singleton_lock import LockedTask
from tests.support import broker_polling

app = Celery("soakapp")
app.conf.update(
    broker_url=os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6379/0"),
    result_backend=os.environ.get("CSL_BACKEND_URL"),
    singleton_lock_url=os.environ.get("CSL_LOCK_URL"),
    task_default_queue=os.environ.get("CSL_QUEUE", "celery"),  # lock retries come back here
    broker_connection_retry_on_startup=True,
    broker_transport_options=broker_polling(),
    worker_prefetch_multiplier=1,
    result_expires=3600,
    # a parked call whose hand-off was lost with a killed child (between the release and the
    # send) is sent again by a sweeper 5 s later, not 60 s: the soak drains in bounded time
    singleton_lock_handoff_timeout=5.0,
)

#: Lock options of the tasks, by policy (besides ``lock_on=("key",)``).
POLICIES: dict[str, dict[str, Any]] = {
    "queue": {"on_duplicate": "queue"},
    "retry": {"on_duplicate": "retry", "lock_retry_backoff": 0.05, "lock_retry_backoff_max": 0.5},
    "skip": {"on_duplicate": "skip"},
}


@functools.cache
def records() -> redis.Redis:
    # one per process: redis-py's pool starts afresh in a forked child (it checks the pid)
    return redis.Redis.from_url(app.conf.singleton_lock_url)


def body(task_id: str, ns: str, key: str, seconds: float) -> str:
    pid = os.getpid()
    pipe = records().pipeline(transaction=False)
    pipe.rpush(f"{ns}:starts", f"{task_id}|{key}|{pid}|{time.time()}")
    pipe.hset(f"{ns}:running", str(pid), task_id)
    pipe.execute()
    time.sleep(seconds)
    pipe.hdel(f"{ns}:running", str(pid))
    pipe.rpush(f"{ns}:ends", f"{task_id}|{time.time()}")
    pipe.execute()
    return key


def _task(policy: str) -> Any:
    def run(self: LockedTask, ns: str, key: str, seconds: float) -> str:
        return body(str(self.request.id), ns, key, seconds)

    run.__name__ = run.__qualname__ = f"soak_{policy}"
    return app.task(
        bind=True,
        base=LockedTask,
        name=f"{__name__}.soak_{policy}",
        lock_on=("key",),
        lock_ttl=5,
        track_started=True,
        **POLICIES[policy],
    )(run)


TASKS = {policy: _task(policy) for policy in POLICIES}
