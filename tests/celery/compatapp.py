"""The app of the side-by-side tests: celery-once's and celery-singleton's own task bases next
to this package's drop-in replacements (``celery_singleton_lock.compat``), the same task
shapes on each, so one scenario runs against both (tests/celery/test_compat_side_by_side.py).

Imported only when celery-singleton is installed; celery-once is optional (its 3.0.1 imports
``six`` without declaring it): without it the ``once_*`` pairs hold ours only.
Configured by :func:`configure` in the test process, or from the ``CSL_*`` environment
variables in a ``celery worker`` subprocess (tests/celery/workers.py, ``app=`` this module).
Every body records its task id in ``runs:<key>`` (and ``gauge:<key>``/``overlaps:<key>``) on
the lock server, then waits for ``gate:<key>`` (tests open it) or sleeps ``seconds``.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import redis
from celery import Celery
from celery_singleton import Singleton as OriginalSingleton

from celery_singleton_lock.compat import QueueOnce, Singleton
from tests.support import broker_polling

try:
    from celery_once import QueueOnce as OriginalQueueOnce
except ImportError:  # not installed, or six missing
    OriginalQueueOnce = None

app = Celery("compatapp")

#: seconds a body waits at most for its gate
GATE_TIMEOUT = 15


def common_settings(*, broker_url: str, lock_url: str, queue: str) -> dict[str, Any]:
    """The settings of every app of the side-by-side tests (compatsettingsapp's too)."""
    return {
        "broker_url": broker_url,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": broker_polling(),
        "task_default_queue": queue,
        "task_ignore_result": True,
        "worker_prefetch_multiplier": 1,
        "singleton_lock_url": lock_url,
        "singleton_backend_url": lock_url,
    }


def configure(
    *, broker_url: str, lock_url: str, queue: str = "compat", backend_url: Optional[str] = None
) -> None:
    """One Redis for the locks of all three: celery-once's, celery-singleton's and ours. Only
    the tasks that say ``ignore_result=False`` store results (in ``backend_url``)."""
    app.conf.update(
        common_settings(broker_url=broker_url, lock_url=lock_url, queue=queue),
        result_backend=backend_url,
        ONCE={
            "backend": "celery_once.backends.Redis",
            "settings": {"url": lock_url, "default_timeout": 3600},
        },
    )


def environment() -> Optional[dict[str, str]]:
    """The servers and queue of a worker subprocess, from its ``CSL_*`` variables; None in
    the test process."""
    if not os.environ.get("CSL_BROKER_URL"):
        return None
    return {
        "broker_url": os.environ["CSL_BROKER_URL"],
        "lock_url": os.environ["CSL_LOCK_URL"],
        "queue": os.environ.get("CSL_QUEUE", "compat"),
    }


_environment = environment()
if _environment:
    configure(**_environment, backend_url=os.environ.get("CSL_BACKEND_URL"))

_store: Optional[redis.Redis] = None


def store() -> redis.Redis:
    global _store
    if _store is None:
        _store = redis.Redis.from_url(app.conf.singleton_lock_url)
    return _store


def open_gate(key: str, count: int = 1) -> None:
    store().rpush(f"gate:{key}", *["open"] * count)


def runs(key: str) -> list[str]:
    return [run.decode() for run in store().lrange(f"runs:{key}", 0, -1)]


def gated(key: str, task_id: Optional[str], seconds: float) -> str:
    r = store()
    if r.incr(f"gauge:{key}") > 1:
        r.incr(f"overlaps:{key}")
    r.rpush(f"runs:{key}", str(task_id))
    try:
        if seconds:
            time.sleep(seconds)
        else:
            r.blpop([f"gate:{key}"], timeout=GATE_TIMEOUT)
    finally:
        r.decr(f"gauge:{key}")
    return str(task_id)


def pair(
    name: str,
    original: Optional[type],
    ours: type,
    *,
    on: Optional[Celery] = None,
    module: str = __name__,
    **options: Any,
) -> dict[str, Any]:
    """``{"original": task, "ours": task}``: ``name(key, other=0, seconds=0)`` on each base,
    with the same options (``ours_options`` only on ours); no original if it is None. On
    app ``on`` (default this module's), named after ``module``."""
    target = app if on is None else on
    ours_options = options.pop("ours_options", {})
    tasks = {}
    for impl, base, extra in (("original", original, {}), ("ours", ours, ours_options)):
        if base is None:
            continue

        def run(self: Any, key: str, other: int = 0, seconds: float = 0) -> str:
            return gated(key, self.request.id, seconds)

        run.__name__ = run.__qualname__ = f"{name}_{impl}"
        # not shared: each app has only its own tasks
        tasks[impl] = target.task(
            bind=True,
            base=base,
            name=f"{module}.{name}_{impl}",
            shared=False,
            **options,
            **extra,
        )(run)
    return tasks


def once(name: str, **options: Any) -> dict[str, Any]:
    return pair(name, OriginalQueueOnce, QueueOnce, **options)


def singleton(name: str, **options: Any) -> dict[str, Any]:
    return pair(name, OriginalSingleton, Singleton, **options)


once_on_key = once("once_on_key", once={"keys": ["key"]})
once_graceful = once("once_graceful", once={"keys": ["key"], "graceful": True})
once_all_args = once("once_all_args")
once_timeout = once("once_timeout", once={"keys": ["key"], "timeout": 60})
once_short = once("once_short", once={"keys": ["key"], "timeout": 2})
once_unlock_before_run = once(
    "once_unlock_before_run",
    once={"keys": ["key"], "unlock_before_run": True},
    ours_options={"lock_retry_backoff": 0.05, "lock_retry_backoff_max": 0.2},
)
#: for the crash: ours with a short lease so that the test need not wait 15 s
once_crash = once("once_crash", once={"keys": ["key"]}, ours_options={"lock_ttl": 2})

singleton_on_key = singleton("singleton_on_key", unique_on=["key"])
singleton_all_args = singleton("singleton_all_args")
singleton_raises = singleton("singleton_raises", unique_on="key", raise_on_duplicate=True)
singleton_expiry = singleton("singleton_expiry", unique_on="key", lock_expiry=60)
singleton_short = singleton("singleton_short", unique_on="key", lock_expiry=2)
singleton_crash = singleton("singleton_crash", unique_on="key", ours_options={"lock_ttl": 2})


@app.task(name=f"{__name__}.record", ignore_result=False, shared=False)
def record(key: str) -> str:
    """A callback or chain step of no lock: records its run in ``runs:<key>``, at once."""
    store().rpush(f"runs:{key}", "record")
    return key
