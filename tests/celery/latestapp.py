"""Tasks of "latest wins" (policy ``replace``, ``lock_debounce``), on lockapp's app: served by
the in-process worker, and by the ``celery -A tests.celery.latestapp`` workers of
tests/celery/test_latest_wins_workers.py. Each body records ``<value>|<start time>`` in
``latest:<key>`` (and ``gauge``/``overlaps`` as lockapp's bodies do)."""

from __future__ import annotations

import os
import time
from typing import Any

from celery_singleton_lock import LockedTask
from tests.celery.lockapp import app
from tests.celery.tasks.core import store

if os.environ.get("CSL_BROKER_URL"):  # a worker process: hand on held calls promptly
    app.conf.singleton_lock_handoff_sweep_interval = 0.1


def record(key: str, value: Any, seconds: float) -> Any:
    r = store()
    if r.incr(f"gauge:{key}") > 1:
        r.incr(f"overlaps:{key}")
    r.rpush(f"latest:{key}", f"{value}|{time.time()}")
    try:
        time.sleep(seconds)
    finally:
        r.decr(f"gauge:{key}")
    return value


_LOCKED = {"bind": True, "base": LockedTask, "lock_on": ("key",), "lock_ttl": 5}


@app.task(**_LOCKED, on_duplicate="replace")
def newest(self: LockedTask, key: str, value: Any, seconds: float = 0.0) -> Any:
    return record(key, value, seconds)


@app.task(**_LOCKED, on_duplicate="replace", lock_debounce=2)
def debounced(self: LockedTask, key: str, value: Any) -> Any:
    return record(key, value, 0.0)


@app.task(**_LOCKED, on_duplicate="replace", lock_debounce=2, lock_debounce_max=4)
def debounced_bounded(self: LockedTask, key: str, value: Any) -> Any:
    return record(key, value, 0.0)


@app.task(**_LOCKED, on_duplicate="replace")
def retried_once(self: LockedTask, key: str) -> None:
    """Records its ``singleton_lock_sent`` header in ``sent:<key>``, then retries once."""
    store().rpush(f"sent:{key}", str((self.request.headers or {}).get("singleton_lock_sent")))
    if not self.request.retries:
        raise self.retry(countdown=0)


@app.task(**_LOCKED)
def skipping(self: LockedTask, key: str) -> None:
    """Policy skip: records its ``singleton_lock_sent`` header (none) in ``sent:<key>``."""
    store().rpush(f"sent:{key}", str((self.request.headers or {}).get("singleton_lock_sent")))


@app.task
def callback(key: str, label: str) -> None:
    """Records ``label`` in ``callbacks:<key>`` (a link, a link_error or a chain step)."""
    store().rpush(f"callbacks:{key}", label)


def started(key: str) -> list[tuple[str, float]]:
    """``(value, start time)`` of each body run on ``key``, in order."""
    runs = [entry.decode().split("|") for entry in store().lrange(f"latest:{key}", 0, -1)]
    return [(value, float(at)) for value, at in runs]
