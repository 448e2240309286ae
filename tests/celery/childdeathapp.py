"""Tasks of the pool-child death tests (tests/celery/test_child_death.py), on lockapp's app:
``celery -A tests.celery.childdeathapp`` workers serve them. Each body records
``<value>|<pid>|<start time>`` in ``death:<key>`` when it starts and ``<value>|<end time>`` in
``death-ends:<key>`` when it ends, so a test finds the child to kill from the body's own pid and
sees whether two bodies of a key overlapped."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from celery_singleton_lock import LockedTask
from celery_singleton_lock.celery.duplicates import parking
from celery_singleton_lock.celery.worker.reclaim import pid_is_gone
from tests.celery.lockapp import app
from tests.celery.tasks.core import store

if os.environ.get("CSL_BROKER_URL"):  # a worker process: hand on held calls promptly
    app.conf.singleton_lock_handoff_sweep_interval = 0.1
if os.environ.get("CSL_SOFT_SHUTDOWN_TIMEOUT"):  # Celery >= 5.5: cancel running bodies after it
    app.conf.worker_soft_shutdown_timeout = float(os.environ["CSL_SOFT_SHUTDOWN_TIMEOUT"])


def record(key: str, value: Any, seconds: float) -> Any:
    r = store()
    ended_values = {value for value, _ in ended(key)}
    if any(
        not pid_is_gone(pid)
        for earlier, pid, _ in started(key)
        if earlier not in ended_values and pid != os.getpid()
    ):  # a body that has not ended, and whose process still runs: two bodies at once
        r.incr(f"overlaps:{key}")
    r.rpush(f"death:{key}", f"{value}|{os.getpid()}|{time.time()}")
    time.sleep(seconds)
    r.rpush(f"death-ends:{key}", f"{value}|{time.time()}")
    return value


_LOCKED = {"bind": True, "base": LockedTask, "lock_on": ("key",)}


def die_before_publishing(task_id: str) -> str:
    """The records key that makes the next process about to publish the parked message of
    ``task_id`` die (``kill -9``) first: a death between a release and its hand-off."""
    return f"die-before-publishing:{task_id}"


_publish = parking.publish


def _publish_or_die(app: Any, message: bytes, name: str) -> bool:
    task_id = message.split(b"\n", 1)[0].decode()
    if store().delete(die_before_publishing(task_id)):
        os.kill(os.getpid(), signal.SIGKILL)
    return _publish(app, message, name)


parking.publish = _publish_or_die  # type: ignore[assignment]


@app.task(**_LOCKED, lock_ttl=1.5, on_duplicate="wait", lock_wait_timeout=60)
def short_lease(self: LockedTask, key: str, value: Any, seconds: float = 0.0) -> Any:
    """A lock of 1.5 s that a duplicate waits for (woken by the release's publish)."""
    return record(key, value, seconds)


@app.task(**_LOCKED, lock_ttl=6, on_duplicate="replace")
def replaced(self: LockedTask, key: str, value: Any, seconds: float = 0.0) -> Any:
    """The newest duplicate waits, parked, for the holder's end (a TTL of 6 s, as issue 30)."""
    return record(key, value, seconds)


@app.task(**_LOCKED, lock_ttl=6, on_duplicate="queue")
def queued(self: LockedTask, key: str, value: Any, seconds: float = 0.0) -> Any:
    """Duplicates parked behind the holder, handed the lock in arrival order (a TTL of 6 s,
    as issue 30)."""
    return record(key, value, seconds)


@app.task(**_LOCKED, lock_ttl=3, on_duplicate="retry", acks_late=True)
def long_acks_late(self: LockedTask, key: str, value: Any, seconds: float = 0.0) -> Any:
    """A long body acknowledged at its end: a soft shutdown that cancels it requeues it."""
    return record(key, value, seconds)


def started(key: str) -> list[tuple[str, int, float]]:
    """``(value, pid, start time)`` of each body run on ``key``, in order."""
    runs = [entry.decode().split("|") for entry in store().lrange(f"death:{key}", 0, -1)]
    return [(value, int(pid), float(at)) for value, pid, at in runs]


def ended(key: str) -> list[tuple[str, float]]:
    """``(value, end time)`` of each body that ran to its end on ``key``, in order."""
    runs = [entry.decode().split("|") for entry in store().lrange(f"death-ends:{key}", 0, -1)]
    return [(value, float(at)) for value, at in runs]
