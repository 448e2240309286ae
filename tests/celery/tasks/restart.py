"""Tasks of ``on_duplicate="restart"`` (tests/celery/test_restart_workers.py), and two of
``"replace"``, one debounced (tests/celery/test_cluster_latest.py runs them on a Redis
Cluster). Each body records ``<task id>|<pid>`` in ``started:<key>`` as it starts, counts in
``overlaps:<key>`` a start while an earlier body of the key is not over (not unwound, and its
process alive), and records how it ended in ``ended:<key>`` (ran to its end) or
``stopped:<key>`` (stopped when asked); ``over:<key>`` lists the bodies that are over, however
they ended."""

from __future__ import annotations

import os
import time

from celery_singleton_lock import LockedTask
from celery_singleton_lock.celery.task import execution
from celery_singleton_lock.celery.worker.reclaim import pid_is_gone
from tests.celery.tasks.core import app, store

_RESTART = {"bind": True, "base": LockedTask, "lock_on": ("key",), "on_duplicate": "restart"}
_GRACE = {"lock_cancel_grace": 1}
# a worker whose bodies read their cancel flag only this often (the fallback): the stop must
# reach them pushed (tests/celery/test_restart_workers.py)
if os.environ.get("CSL_CANCEL_POLL"):
    execution.CANCEL_POLL = float(os.environ["CSL_CANCEL_POLL"])


def started(key: str, task_id: str) -> None:
    """Record this body's start; an earlier body of ``key`` whose process is alive and has
    not recorded its end is running too: an overlap."""
    r = store()
    over = {entry.decode() for entry in r.lrange(f"over:{key}", 0, -1)}
    for entry in r.lrange(f"started:{key}", 0, -1):
        other_id, pid = entry.decode().rsplit("|", 1)
        if other_id not in over and not pid_is_gone(int(pid)):
            r.incr(f"overlaps:{key}")
    r.rpush(f"started:{key}", f"{task_id}|{os.getpid()}")


def ended(key: str, task_id: str, how: str) -> None:
    store().rpush(f"over:{key}", task_id)
    store().rpush(f"{how}:{key}", task_id)


@app.task(**_RESTART)
def cooperative(self: LockedTask, key: str, seconds: float = 20.0) -> str:
    """Looks at its lock's ``cancelled`` every 0.1 s, and ends as superseded when asked."""
    started(key, self.request.id)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if self.request.lock.cancelled:
            ended(key, self.request.id, "stopped")
            self.request.lock.raise_if_cancelled()
        time.sleep(0.1)
    ended(key, self.request.id, "ended")
    return str(self.request.id)


def ignoring_the_stop(key: str, task_id: str, seconds: float) -> str:
    """Never looks at ``cancelled``: only its worker's grace stops it (a SIGTERM may unwind
    the body before its process exits: it is over then, not ended)."""
    started(key, task_id)
    try:
        time.sleep(seconds)
    except BaseException:
        store().rpush(f"over:{key}", task_id)
        raise
    ended(key, task_id, "ended")
    return task_id


@app.task(**_RESTART, **_GRACE)
def stubborn(self: LockedTask, key: str, seconds: float = 30.0) -> str:
    return ignoring_the_stop(key, str(self.request.id), seconds)


@app.task(**_RESTART, **_GRACE, lock_ttl=3)
def short_ttl(self: LockedTask, key: str, seconds: float = 30.0) -> str:
    """:func:`stubborn` with a 3 s lock: a killed worker's lock expires soon."""
    return ignoring_the_stop(key, str(self.request.id), seconds)


@app.task(bind=True, base=LockedTask, lock_on=("key",), on_duplicate="replace")
def newest_waits(self: LockedTask, key: str, seconds: float = 0.0) -> str:
    """``replace``: runs to its end (``seconds``); only the newest call waits behind it."""
    return ignoring_the_stop(key, str(self.request.id), seconds)


@app.task(bind=True, base=LockedTask, lock_on=("key",), on_duplicate="replace", lock_debounce=2)
def debounced(self: LockedTask, key: str) -> str:
    """``replace`` with ``lock_debounce=2``: the newest of a burst runs 2 s after it came; the
    time its body started is recorded in ``ran-at:<key>``."""
    store().rpush(f"ran-at:{key}", str(time.time()))
    return ignoring_the_stop(key, str(self.request.id), 0.0)
