"""A beat-scheduled job that must never run twice at once, even with two ``celery beat``s.

Beat fires ``rebuild_report`` every 2 s; one run takes about 5 s. Without a lock, runs would
pile up (and two beats double every tick). With ``base=LockedTask, on_duplicate="skip"``, a tick
that arrives while a run holds the lock ends at once, logging who holds it::

    celery -A examples.beat_singleton.app worker -c 2
    celery -A examples.beat_singleton.app beat -s /tmp/beat-1 --pidfile=/tmp/beat-1.pid

Servers come from the environment (see ``examples.common.Settings.from_env``):
``CELERY_BROKER_URL``, ``CELERY_RESULT_BACKEND``, ``SINGLETON_LOCK_URL`` (the lock server,
``singleton_lock_url``), ``EXAMPLE_DATA_URL`` (where runs are recorded), ``EXAMPLE_NAMESPACE``.
Each run records ``start``/``end`` in the hash ``<namespace>:run:<task id>`` and its id in the
list ``<namespace>:runs``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from celery_singleton_lock import LockedTask, lock_duplicate
from examples.common import Settings, announce_readiness, configure_app, data_client

settings = Settings.from_env()
JOB_SECONDS = float(os.environ.get("EXAMPLE_JOB_SECONDS", "5"))
INTERVAL = float(os.environ.get("EXAMPLE_INTERVAL", "2"))
TASK_NAME = "examples.beat_singleton.rebuild_report"

# --8<-- [start:app]  (docs/how-to/beat-singleton.md shows from here to its end marker)
app = Celery("beat_singleton")
configure_app(app, settings)
app.conf.beat_schedule = {
    "rebuild-report": {"task": TASK_NAME, "schedule": INTERVAL},
}
announce_readiness(app, settings)


def key(*parts: str) -> str:
    return ":".join((settings.namespace, *parts))


@app.task(bind=True, name=TASK_NAME, base=LockedTask, lock_ttl=15, on_duplicate="skip")
def rebuild_report(self: Any) -> dict[str, Any]:
    """About ``JOB_SECONDS`` of "work"; records when it started and ended."""
    store = data_client(settings.data)
    task_id = self.request.id
    started = time.time()
    # An independent overlap detector: how many bodies are inside right now.
    if store.incr(key("inside")) > 1:
        store.incr(key("overlaps_seen"))
    store.hset(
        key("run", task_id),
        mapping={"start": started, "worker": self.request.hostname or "?", "pid": os.getpid()},
    )
    store.rpush(key("runs"), task_id)
    try:
        deadline = started + JOB_SECONDS
        while time.time() < deadline:
            time.sleep(min(0.25, max(0.0, deadline - time.time())))
            # A long job checks its lease now and then: lost means another run may start.
            if self.request.lock is not None:  # None when called directly, without a worker
                self.request.lock.check()
    finally:
        store.hset(key("run", task_id), "end", time.time())
        store.decr(key("inside"))
    return {"task_id": task_id, "seconds": round(time.time() - started, 3)}


# --8<-- [end:app]


def count_duplicates(sender: Any = None, action: str = "?", **_: Any) -> None:
    """``lock_duplicate`` receiver (runs in the worker): counts duplicates by action (metrics)."""
    if getattr(sender, "name", None) == TASK_NAME:
        data_client(settings.data).incr(key("duplicates", action))


lock_duplicate.connect(count_duplicates, weak=False)
