"""The app every task module registers on, and what their bodies share.

``app`` is the Celery app of ``tests.celery.lockapp`` (the module that imports every task
module, and the one subprocess workers load with ``-A``). Configured from the environment
(CSL_BROKER_URL, CSL_BACKEND_URL, CSL_LOCK_URL, CSL_VISIBILITY_TIMEOUT; CSL_LOCK_TRANSPORT_OPTIONS,
JSON, for a sentinel:// lock URL) so that subprocess workers see the same servers as the test,
or by :func:`configure` in the test process. Bodies record what they do in the lock Redis (or
in CSL_RECORDS_URL when set, e.g. when the lock URL is a Sentinel group's): ``gauge:<key>``
(bodies inside now), ``overlaps:<key>`` (times a body found another inside), ``runs:<key>``
(one entry per run).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Iterator, Optional

import redis
from celery import Celery

from celery_singleton_lock import LockedTask
from tests.support import broker_polling

app = Celery("lockapp")

# What a task reads when it is bound (Celery's ``Task.bind``, LockedTask's options) belongs to
# the app's definition, set before any task exists: a task keeps what it read then, and a
# test module may bind one before the session configures the app (``policies.hold_skip.name``
# at import does; so does a test that sends by name before it asks for ``celery_app``).
# configure() only points the app at servers. Bound with task_track_started set later, a
# task would store no STARTED; the broker URL, a closed port here, gives the kind of broker
# every configure() gives (Redis), whose priority order the tasks' options read.
app.add_defaults({"task_track_started": True, "broker_url": "redis://127.0.0.1:1/0"})

#: lock_min_replicas of the tasks that wait for replicas: a worker whose locks are on a Redis
#: Cluster refuses to start with one (tests/celery/test_cluster.py sets 0).
REPLICAS = int(os.environ.get("CSL_MIN_REPLICAS", "1"))


class SyncAccount(LockedTask):
    """A class-based task registered without a name (``app.register_task``): its name is
    made from this module and the class (tests/celery/test_lock_scope.py)."""

    lock_on = ("account",)

    def run(self, account: str) -> dict[str, Any]:
        handle = self.request.lock
        return {"held": handle.held, "key_held": bool(store().exists(handle.key))}


#: Registered by :func:`configure` (``register_task`` finalizes the app: settings first).
sync_account: Any = None


def configure(
    *,
    broker_url: str,
    backend_url: str,
    lock_url: str,
    visibility_timeout: Optional[float] = None,
    **extra: Any,
) -> None:
    transport: dict[str, Any] = dict(broker_polling())
    if visibility_timeout is not None:
        # kombu's Redis transport restores unacked messages only every
        # unacked_restore_interval x unacked_restore_throttle: make redelivery prompt.
        transport.update(
            visibility_timeout=visibility_timeout,
            unacked_restore_interval=0.5,
            unacked_restore_throttle=1,
        )
    app.conf.update(
        broker_url=broker_url,
        result_backend=backend_url,
        singleton_lock_url=lock_url,
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        result_expires=600,
        # tests stop servers on purpose: give up reconnecting the result store quickly
        result_backend_transport_options={
            "retry_policy": {"max_retries": 2, "interval_start": 0, "interval_step": 0.2}
        },
        **extra,
    )
    global sync_account
    sync_account = app.register_task(SyncAccount())


if os.environ.get("CSL_BROKER_URL"):
    configure(
        broker_url=os.environ["CSL_BROKER_URL"],
        backend_url=os.environ["CSL_BACKEND_URL"],
        lock_url=os.environ["CSL_LOCK_URL"],
        visibility_timeout=float(os.environ["CSL_VISIBILITY_TIMEOUT"])
        if os.environ.get("CSL_VISIBILITY_TIMEOUT")
        else None,
        singleton_lock_transport_options=json.loads(
            os.environ.get("CSL_LOCK_TRANSPORT_OPTIONS") or "null"
        ),
    )

if os.environ.get("CSL_QUEUE"):
    # one queue per test: lock retries and redeliveries come back to the test's own workers
    app.conf.task_default_queue = os.environ["CSL_QUEUE"]

# A join task needs a result backend when it is bound: configure() sets the real one; an app
# imported unconfigured (the CLI's error tests) binds against this in-memory one. Not shared
# (shared=False, tasks/join.py): other apps finalized in the tests' process have no result
# backend.
app.add_defaults({"result_backend": "cache+memory://"})

_store: Optional[redis.Redis] = None
_store_pid = 0


def store() -> redis.Redis:
    """The Redis where bodies record what they do (the lock server, another key space)."""
    global _store, _store_pid
    if _store is None or _store_pid != os.getpid():
        _store = redis.Redis.from_url(
            os.environ.get("CSL_RECORDS_URL") or app.conf.singleton_lock_url
        )
        _store_pid = os.getpid()
    return _store


@contextlib.contextmanager
def inside(key: str, task_id: Optional[str]) -> Iterator[None]:
    """A body of ``key`` is inside for the block: counted in ``gauge:<key>`` (and in
    ``overlaps:<key>`` if another was inside too), its run recorded in ``runs:<key>``."""
    r = store()
    if r.incr(f"gauge:{key}") > 1:
        r.incr(f"overlaps:{key}")
    r.rpush(f"runs:{key}", f"{task_id}|{os.getpid()}|{time.time()}")
    try:
        yield
    finally:
        r.decr(f"gauge:{key}")


def body(key: str, seconds: float, task_id: Optional[str]) -> dict[str, Any]:
    with inside(key, task_id):
        time.sleep(seconds)
    return {"key": key, "pid": os.getpid()}


def keyed_task(
    module: str, name: str, *, seconds: float = 0.0, base: type = LockedTask, **options: Any
) -> Any:
    """A task ``<module>.<name>(key, seconds=...)`` locked on ``key`` whose body is
    :func:`body`: the shape of most tasks here, which differ only in their lock options."""

    def run(self: LockedTask, key: str, seconds: float = seconds) -> dict[str, Any]:
        return body(key, seconds, self.request.id)

    run.__name__ = run.__qualname__ = name
    return app.task(bind=True, base=base, name=f"{module}.{name}", lock_on=("key",), **options)(run)


#: seconds a gated body waits at most for its gate (tests open it with ``open_gate``)
GATE_TIMEOUT = 15


def open_gate(key: str, count: int = 1) -> None:
    store().rpush(f"gate:{key}", *["open"] * count)


def gated_body(key: str, task_id: Optional[str]) -> str:
    """Records the run in ``runs:<key>`` then blocks until the test opens ``gate:<key>``."""
    store().rpush(f"runs:{key}", str(task_id))
    store().blpop([f"gate:{key}"], timeout=GATE_TIMEOUT)
    return str(task_id)
