"""The app of ``bench queue``'s ``celery worker`` process: one task per ``on_duplicate`` policy.

Configured from the environment that ``tests/celery/workers.py`` gives its workers
(``CSL_BROKER_URL``, ``CSL_LOCK_URL``, ``CSL_QUEUE``). Every task is ``run(batch, key, index,
seconds)``, locked on ``key``, and differs from the others only in its lock options. Records,
in the lock server, under the batch (the bench reads and deletes them):

- ``qb:{batch}:runs:<key>``: one ``index|start|end`` per body run (``time.time()``, same host);
- ``qb:{batch}:gauge:<key>`` / ``qb:{batch}:overlaps``: bodies inside now / times a body
  started while another body of the same key was inside;
- ``qb:{batch}:slot``: seconds of worker slot used by every execution (``task_prerun`` to
  ``task_postrun``: a waiter's wait, a parked or retried duplicate's short visit, a body), and
  ``qb:{batch}:executions``: how many executions there were;
- ``qb:{batch}:duplicates``: ``lock_duplicate`` signals by action (``retry``, ``wait``,
  ``queue``): lock retries sent, waiters, calls parked.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import redis
from celery import Celery
from celery.signals import task_postrun, task_prerun

from celery_singleton_lock.celery import LockedTask
from celery_singleton_lock.celery.signals import lock_duplicate

app = Celery("bench_queue")
app.conf.update(
    broker_url=os.environ.get("CSL_BROKER_URL", "redis://127.0.0.1:6379/0"),
    singleton_lock_url=os.environ.get("CSL_LOCK_URL"),
    task_default_queue=os.environ.get("CSL_QUEUE", "celery"),  # lock retries come back here
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
)

#: The contenders: task name -> lock options (besides ``lock_on=("key",)``).
POLICIES: dict[str, dict[str, Any]] = {
    "queue": {"on_duplicate": "queue"},
    # what a user gets by default: lock_retry_backoff=1.0, lock_retry_backoff_max=60
    "retry": {"on_duplicate": "retry"},
    "retry_tuned": {
        "on_duplicate": "retry",
        "lock_retry_backoff": 0.05,
        "lock_retry_backoff_max": 0.5,
    },
    # long enough that no waiter of the bench ever times out into a retry
    "wait": {"on_duplicate": "wait", "lock_wait_timeout": 900},
}

_store: Optional[redis.Redis] = None
_store_pid = 0
#: task id -> task_prerun time, in this process
_started: dict[str, float] = {}


def store() -> redis.Redis:
    """The lock server, a client per process (prefork children make their own)."""
    global _store, _store_pid
    if _store is None or _store_pid != os.getpid():
        _store = redis.Redis.from_url(app.conf.singleton_lock_url)
        _store_pid = os.getpid()
    return _store


def body(batch: str, key: str, index: int, seconds: float) -> int:
    r = store()
    if r.incr(f"qb:{batch}:gauge:{key}") > 1:
        r.incr(f"qb:{batch}:overlaps")
    start = time.time()
    try:
        time.sleep(seconds)
    finally:
        end = time.time()
        pipe = r.pipeline(transaction=False)
        pipe.decr(f"qb:{batch}:gauge:{key}")
        pipe.rpush(f"qb:{batch}:runs:{key}", f"{index}|{start}|{end}")
        pipe.execute()
    return index


def _policy_task(policy: str, options: dict[str, Any]) -> Any:
    def run(self: LockedTask, batch: str, key: str, index: int, seconds: float) -> int:
        return body(batch, key, index, seconds)

    run.__name__ = run.__qualname__ = policy
    return app.task(
        bind=True, base=LockedTask, name=f"bench_queue.{policy}", lock_on=("key",), **options
    )(run)


TASKS = {policy: _policy_task(policy, options) for policy, options in POLICIES.items()}


def _batch_of(args: Any) -> Optional[str]:
    return str(args[0]) if args else None


@task_prerun.connect  # type: ignore[untyped-decorator]
def _prerun(task_id: str = "", **_: Any) -> None:
    _started[task_id] = time.perf_counter()


@task_postrun.connect  # type: ignore[untyped-decorator]
def _postrun(task_id: str = "", args: Any = None, **_: Any) -> None:
    started = _started.pop(task_id, None)
    batch = _batch_of(args)
    if started is None or batch is None:
        return
    pipe = store().pipeline(transaction=False)
    pipe.incrbyfloat(f"qb:{batch}:slot", time.perf_counter() - started)
    pipe.incr(f"qb:{batch}:executions")
    pipe.execute()


@lock_duplicate.connect  # type: ignore[untyped-decorator]
def _duplicate(sender: Any = None, action: str = "", **_: Any) -> None:
    batch = _batch_of(getattr(getattr(sender, "request", None), "args", None))
    if batch is not None:
        store().hincrby(f"qb:{batch}:duplicates", action, 1)
