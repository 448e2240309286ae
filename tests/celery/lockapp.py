"""The Celery app the integration tests run, in-process or as real `celery worker` processes.

Configured from the environment (CSL_BROKER_URL, CSL_BACKEND_URL, CSL_LOCK_URL,
CSL_VISIBILITY_TIMEOUT; CSL_LOCK_TRANSPORT_OPTIONS, JSON, for a sentinel:// lock URL) so that
subprocess workers see the same servers as the test. Bodies record what they do in the lock
Redis (or in CSL_RECORDS_URL when set, e.g. when the lock URL is a Sentinel group's):
``gauge:<key>`` (bodies inside now), ``overlaps:<key>`` (times a body found another inside),
``runs:<key>`` (one entry per run).
"""

from __future__ import annotations

import enum
import json
import os
import time
from typing import Any, Optional

import redis
from celery import Celery
from celery.exceptions import Ignore, Reject

from celery_singleton_lock import LockedTask, LockLostError

app = Celery("lockapp")


class SyncAccount(LockedTask):
    """A class-based task registered without a name (``app.register_task``)."""

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
    transport: dict[str, Any] = {}
    if visibility_timeout is not None:
        # kombu's Redis transport restores unacked messages only every
        # unacked_restore_interval x unacked_restore_throttle: make redelivery prompt.
        transport = {
            "visibility_timeout": visibility_timeout,
            "unacked_restore_interval": 0.5,
            "unacked_restore_throttle": 1,
        }
    app.conf.update(
        broker_url=broker_url,
        result_backend=backend_url,
        singleton_lock_url=lock_url,
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        task_track_started=True,
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


def body(key: str, seconds: float, task_id: Optional[str]) -> dict[str, Any]:
    r = store()
    inside = r.incr(f"gauge:{key}")
    if inside > 1:
        r.incr(f"overlaps:{key}")
    r.rpush(f"runs:{key}", f"{task_id}|{os.getpid()}|{time.time()}")
    try:
        time.sleep(seconds)
    finally:
        r.decr(f"gauge:{key}")
    return {"key": key, "pid": os.getpid()}


def keyed_task(name: str, *, seconds: float = 0.0, base: type = LockedTask, **options: Any) -> Any:
    """A task ``name(key, seconds=...)`` locked on ``key`` whose body is :func:`body`: the
    shape of most tasks here, which differ only in their lock options."""

    def run(self: LockedTask, key: str, seconds: float = seconds) -> dict[str, Any]:
        return body(key, seconds, self.request.id)

    run.__name__ = run.__qualname__ = name
    return app.task(bind=True, base=base, name=f"{__name__}.{name}", lock_on=("key",), **options)(
        run
    )


hold_skip = keyed_task("hold_skip", on_duplicate="skip", lock_ttl=5)
hold_retry = keyed_task(
    "hold_retry",
    on_duplicate="retry",
    lock_ttl=5,
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.5,
)
hold_retry_twice = keyed_task(
    "hold_retry_twice",
    on_duplicate="retry",
    lock_ttl=5,
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.1,
    lock_max_retries=2,
)
hold_wait = keyed_task("hold_wait", on_duplicate="wait", lock_wait_timeout=10)
hold_fail = keyed_task("hold_fail", on_duplicate="fail")
short_ttl = keyed_task("short_ttl", lock_ttl=1, on_duplicate="skip")
#: The policy of the queue tasks below: a worker whose locks are on a Redis Cluster refuses
#: to start with a queue task (tests/celery/test_cluster.py sets "retry").
QUEUE = os.environ.get("CSL_QUEUE_POLICY", "queue")
#: lock_min_replicas of the tasks that wait for replicas: a worker whose locks are on a Redis
#: Cluster refuses to start with one (tests/celery/test_cluster.py sets 0).
REPLICAS = int(os.environ.get("CSL_MIN_REPLICAS", "1"))
hold_queue = keyed_task("hold_queue", on_duplicate=QUEUE, lock_ttl=5)


@app.task(bind=True, base=LockedTask, lock_on=("key",), on_duplicate=QUEUE, lock_ttl=5)
def queued_in_order(self: LockedTask, key: str, index: int, seconds: float = 0.0) -> int:
    """Records ``index`` in ``order:<key>`` as its body starts (policy queue)."""
    store().rpush(f"order:{key}", index)
    body(key, seconds, self.request.id)
    return index


@app.task(
    bind=True, base=LockedTask, lock_on=("key",), on_duplicate=QUEUE, lock_ttl=5, acks_late=True
)
def queued_acks_late(self: LockedTask, key: str, index: int, seconds: float = 0.0) -> int:
    """``queued_in_order``, acknowledged after the run (a redelivery repeats the message)."""
    store().rpush(f"order:{key}", index)
    body(key, seconds, self.request.id)
    return index


@app.task(bind=True, base=LockedTask, lock_on=("key",), on_duplicate=QUEUE, lock_ttl=5)
def queued_retries_once(self: LockedTask, key: str, index: int, seconds: float = 0.0) -> int:
    """``queued_in_order`` whose first attempt ends with ``self.retry(countdown=0.2)``."""
    store().rpush(f"order:{key}", index)
    body(key, seconds, self.request.id)
    if not self.request.retries:
        raise self.retry(countdown=0.2, max_retries=1)
    return index


class Colour(enum.Enum):
    """An argument JSON cannot hold (the lock name's key builder accepts it)."""

    RED = "red"


@app.task(bind=True, base=LockedTask, lock_on=("key",), on_duplicate=QUEUE, lock_ttl=5)
def queued_colour(self: LockedTask, key: str, colour: Colour) -> str:
    """Policy queue, with an argument only pickle can carry; returns the colour's name."""
    store().rpush(f"order:{key}", colour.name)
    return colour.name


# -- enqueue deduplication ------------------------------------------------------------------

#: seconds a gated body waits at most for its gate (tests open it with ``open_gate``)
GATE_TIMEOUT = 15


def open_gate(key: str, count: int = 1) -> None:
    store().rpush(f"gate:{key}", *["open"] * count)


def gated_body(key: str, task_id: Optional[str]) -> str:
    """Records the run in ``runs:<key>`` then blocks until the test opens ``gate:<key>``."""
    store().rpush(f"runs:{key}", str(task_id))
    store().blpop([f"gate:{key}"], timeout=GATE_TIMEOUT)
    return str(task_id)


@app.task(bind=True, base=LockedTask, lock_on=("key",), lock_ttl=5)
def gated(self: LockedTask, key: str) -> str:
    return gated_body(key, self.request.id)


@app.task(bind=True, base=LockedTask, lock_on=("key",), dedupe_on_enqueue=True, lock_ttl=5)
def dedupe_gated(self: LockedTask, key: str) -> str:
    return gated_body(key, self.request.id)


@app.task(
    bind=True,
    base=LockedTask,
    lock_on=("key",),
    dedupe_on_enqueue=True,
    on_duplicate="retry",
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.2,
)
def dedupe_lock_retry(self: LockedTask, key: str) -> str:
    store().rpush(f"runs:{key}", str(self.request.id))
    return str(self.request.id)


@app.task(bind=True, base=LockedTask, lock_on=("key",), dedupe_on_enqueue=True, max_retries=3)
def dedupe_retries_itself(self: LockedTask, key: str) -> int:
    store().rpush(f"runs:{key}", str(self.request.id))
    if self.request.retries < 1:
        raise self.retry(countdown=0.1)
    return int(self.request.retries)


# -- drop-in replacements (celery_singleton_lock.compat) ---------------------------------------

from celery_singleton_lock.compat import QueueOnce, Singleton  # noqa: E402


def compat_task(name: str, base: type, **options: Any) -> Any:
    """A gated task ``name(key, other=0)`` (see :func:`gated_body`) on ``base``."""

    def run(self: LockedTask, key: str, other: int = 0) -> str:
        return gated_body(key, self.request.id)

    run.__name__ = run.__qualname__ = name
    return app.task(bind=True, base=base, name=f"{__name__}.{name}", **options)(run)


once_on_key = compat_task("once_on_key", QueueOnce, once={"keys": ["key"]})
once_graceful = compat_task("once_graceful", QueueOnce, once={"keys": ["key"], "graceful": True})
once_all_args = compat_task("once_all_args", QueueOnce)
once_per_task = compat_task("once_per_task", QueueOnce, once={"keys": []})
once_timeout = compat_task("once_timeout", QueueOnce, once={"keys": ["key"], "timeout": 60})
once_unlock_before_run = compat_task(
    "once_unlock_before_run",
    QueueOnce,
    once={"keys": ["key"], "unlock_before_run": True},
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.2,
)
singleton_on_key = compat_task("singleton_on_key", Singleton, unique_on=["key"])
singleton_all_args = compat_task("singleton_all_args", Singleton)
singleton_raises = compat_task(
    "singleton_raises", Singleton, unique_on="key", raise_on_duplicate=True
)
singleton_expiry = compat_task("singleton_expiry", Singleton, unique_on="key", lock_expiry=60)


# -- exit paths ----------------------------------------------------------------------------


@app.task(bind=True, base=LockedTask)
def raises(self: LockedTask, key: str) -> None:
    raise ValueError(f"boom {key}")


@app.task(bind=True, base=LockedTask, max_retries=3)
def retries_once(self: LockedTask, key: str) -> str:
    if self.request.retries == 0:
        raise self.retry(countdown=0)
    return "second attempt"


@app.task(
    bind=True,
    base=LockedTask,
    autoretry_for=(KeyError,),
    max_retries=1,
    default_retry_delay=0,
)
def autoretries(self: LockedTask, key: str) -> str:
    if self.request.retries == 0:
        raise KeyError(key)
    return "second attempt"


@app.task(bind=True, base=LockedTask)
def ignores(self: LockedTask, key: str) -> None:
    raise Ignore()


@app.task(bind=True, base=LockedTask)
def rejects(self: LockedTask, key: str) -> None:
    raise Reject("rejected", requeue=False)


@app.task(bind=True, base=LockedTask, soft_time_limit=0.5)
def soft_limited(self: LockedTask, key: str) -> None:
    time.sleep(5)


@app.task(bind=True, base=LockedTask, time_limit=1, lock_ttl=30)
def hard_limited(self: LockedTask, key: str) -> None:
    body(key, 10, self.request.id)


@app.task(bind=True, base=LockedTask, lock_ttl=30)
def long_running(self: LockedTask, key: str, seconds: float = 10) -> dict[str, Any]:
    return body(key, seconds, self.request.id)


@app.task(bind=True, base=LockedTask, lock_on=("key",))
def reentrant(self: LockedTask, key: str, depth: int) -> list[int]:
    store().incr(f"reentrant:{key}")
    if depth == 0:
        return [0]
    inner = self.apply(args=(key, depth - 1), throw=True)
    return [depth, *inner.get()]


@app.task(bind=True, base=LockedTask, lock_ttl=0.6)
def watches_its_lock(self: LockedTask, key: str) -> dict[str, Any]:
    """Deletes its own lock key (as a takeover would), then waits to be told it is lost."""
    handle = self.request.lock
    store().delete(handle.key)
    deadline = time.monotonic() + 5
    while not handle.lost and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        handle.check()
        raised = False
    except LockLostError as exc:
        raised = type(exc).__name__
    return {"lost": handle.lost, "check_raised": raised}


@app.task(bind=True, base=LockedTask, lock_fencing=True, lock_on=("account",))
def fenced(self: LockedTask, account: str) -> Optional[int]:
    return self.request.lock.fence  # type: ignore[no-any-return]


@app.task(bind=True, base=LockedTask, lock_on_backend_error="run")
def runs_unlocked(self: LockedTask, key: str) -> bool:
    return bool(self.request.lock.locked)


@app.task(bind=True, base=LockedTask, lock_retry_backoff=0.2, lock_retry_backoff_max=0.5)
def retries_on_outage(self: LockedTask, key: str) -> str:
    return "ran"


@app.task(bind=True, base=LockedTask)
def reports_its_state(self: LockedTask, key: str) -> str:
    return str(self.backend.get_task_meta(self.request.id)["status"])


@app.task(base=LockedTask)
def takes_anything(value: Any) -> None:
    return None


# -- one lock scope: every path after the acquire ends in a release --------------------------


@app.task(bind=True, base=LockedTask, lock_on=("key",))
def reads_its_request(self: LockedTask, key: str) -> dict[str, Any]:
    """What the Celery adapter reads from a running request."""
    from celery_singleton_lock.celery import celery_api

    return {
        "header": celery_api.header(self.request, "csl_test_header"),
        "hard_time_limit": celery_api.hard_time_limit(self.request),
        "redelivered": celery_api.is_redelivered(self.request),
        "is_current": celery_api.current_request(self) is self.request,
    }


@app.task(
    bind=True,
    base=LockedTask,
    lock_on=("key",),
    lock_min_replicas=REPLICAS,
    lock_min_replicas_timeout=0.05,
)
def needs_a_replica(self: LockedTask, key: str) -> str:
    """Holds its lock only once a replica has it: the test lock server has none."""
    return "ran"


@app.task(
    bind=True,
    base=LockedTask,
    lock_on=("key",),
    lock_min_replicas=REPLICAS,
    # 0.5 s, not 0.05: a replica that has just attached may take longer than 50 ms to
    # acknowledge, and each such acquire would pause (and log) again
    lock_min_replicas_timeout=0.5,
    lock_retry_backoff=0.1,
    lock_retry_backoff_max=0.2,
)
def paused_without_replica(self: LockedTask, key: str) -> str:
    """``needs_a_replica`` with a short lock-retry backoff: retries until a replica is attached."""
    return "ran"


@app.task(bind=True, base=LockedTask, lock_on=("key",))
def finds_its_worker_request(self: LockedTask, key: str) -> dict[str, Any]:
    """What the worker's main process reads from this run's Request (celery_api)."""
    from celery_singleton_lock.celery import celery_api

    mine = [r for r in celery_api.running_requests() if r.id == self.request.id]
    if not mine:
        return {"found": False}
    request = mine[0]
    return {
        "found": True,
        "task_is_this": request.task is self,
        "child_pid": celery_api.child_pid(request),
        "pid": os.getpid(),
        "hard_limit": celery_api.accepted_hard_time_limit(request),
        "accepted_at": celery_api.accepted_at(request),
        "args": list(request.args),
        "hostname": request.hostname,
    }


class FailsAfterItsLock(LockedTask):
    """``before_start`` fails after the lock is taken whenever ``setup-fails:<key>`` exists
    (as a subclass's own set-up, or a result backend storing STARTED, can fail)."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        super().before_start(task_id, args, kwargs)
        if store().exists(f"setup-fails:{args[0]}"):
            raise RuntimeError("set-up failed after the lock was taken")


@app.task(bind=True, base=FailsAfterItsLock, lock_on=("key",))
def fails_after_its_lock(self: LockedTask, key: str) -> dict[str, Any]:
    handle = self.request.lock
    return {"reentrant": handle.reentrant, "key_held": bool(store().exists(handle.key))}


@app.task(bind=True, base=LockedTask, lock_on=("key",))
def corrupts_its_lock(self: LockedTask, key: str) -> str:
    """Replaces its own lock key with a hash: the release then finds no lock of ours there."""
    lock = self.request.lock.key
    store().delete(lock)
    store().hset(lock, "foreign", "data")
    return "body done"


@app.task(bind=True, base=LockedTask, lock_on=("key",), time_limit=1, lock_ttl=0.6)
def outlives_its_time_limit(self: LockedTask, key: str) -> dict[str, Any]:
    """Runs past its hard time limit on a pool that does not enforce it (threads)."""
    handle = self.request.lock
    deadline = time.monotonic() + 4
    while not handle.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"lost": handle.lost, "key_exists": bool(store().exists(handle.key))}


class CallsRunItself(LockedTask):
    """Overrides ``__call__`` without calling ``super().__call__``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)


class CallsSuper(LockedTask):
    """Overrides ``__call__``, calls ``super().__call__``, then says if the lock is still held."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        in_body = super().__call__(*args, **kwargs)
        return [in_body, self.request.lock is not None and self.request.lock.held]


@app.task(bind=True, base=CallsRunItself)
def own_call(self: LockedTask, key: str) -> bool:
    return self.request.lock is not None and self.request.lock.held


@app.task(bind=True, base=CallsSuper)
def own_call_super(self: LockedTask, key: str) -> bool:
    return self.request.lock is not None and self.request.lock.held


class CountsRequestPushes(LockedTask):
    """Counts ``Task.push_request``: Celery's ``Task.__call__`` pushes a copy of the request,
    the tracer does not (it pushes on the stack directly)."""

    pushes = 0

    def push_request(self, *args: Any, **kwargs: Any) -> None:
        CountsRequestPushes.pushes += 1
        super().push_request(*args, **kwargs)


@app.task(bind=True, base=CountsRequestPushes)
def counts_pushes(self: LockedTask, key: str) -> bool:
    return self.request.lock is not None and self.request.lock.held


# -- on_duplicate="join": duplicates end with the running execution's outcome ----------------
# (tests/celery/test_join.py)

# A join task needs a result backend when it is bound: configure() sets the real one; an app
# imported unconfigured (the CLI's error tests) binds against this in-memory one. Not shared
# (shared=False): other apps finalized in the tests' process have no result backend.
app.add_defaults({"result_backend": "cache+memory://"})

#: a duplicate waits 1 s for the holder, then lock-retries (a worker slot is never held longer)
join_value = keyed_task(
    "join_value",
    shared=False,
    on_duplicate="join",
    lock_wait_timeout=1,
    lock_retry_backoff=0.1,
    lock_retry_backoff_max=0.3,
)
#: the holder is killed -9 in its worker: its lock expires after 2 s with no outcome stored
join_short_ttl = keyed_task(
    "join_short_ttl", shared=False, on_duplicate="join", lock_ttl=2, lock_wait_timeout=20
)


class AccountMissing(LookupError):
    """What ``join_raises`` raises: a class of the test's own, rebuilt from the backend."""


@app.task(
    bind=True,
    base=LockedTask,
    shared=False,
    lock_on=("key",),
    on_duplicate="join",
    lock_wait_timeout=10,
)
def join_raises(self: LockedTask, key: str, seconds: float = 0.0) -> None:
    body(key, seconds, self.request.id)
    raise AccountMissing(f"no account {key}")


@app.task(bind=True, base=LockedTask, lock_on=("key",), on_duplicate="skip", max_retries=1)
def retries_in_two_seconds(self: LockedTask, key: str, retry_first: bool) -> dict[str, Any]:
    """With ``retry_first``, its first attempt calls ``self.retry(countdown=2)``; otherwise (and
    on the retry) the body runs 3 s."""
    if retry_first and self.request.retries == 0:
        raise self.retry(countdown=2)
    return body(key, 3.0, self.request.id)


@app.task
def collects(results: list[Any]) -> list[Any]:
    """A chord callback: what the chord's members returned."""
    return results


@app.task
def tags(value: Any, tag: str) -> list[Any]:
    """A chain step or link callback: the value it was given, tagged."""
    return [tag, value]


@app.task
def records_errback(task_id: str, *, key: str) -> None:
    """A ``link_error`` errback: records the failed task's id in ``errbacks:<key>``. One
    positional parameter: Celery < 5.4 calls one of more as ``(request, exc, traceback)``."""
    store().rpush(f"errbacks:{key}", task_id)


# -- tasks for real worker processes --------------------------------------------------------
# (tests/celery/test_real_workers.py starts `celery worker` subprocesses on these)

if os.environ.get("CSL_QUEUE"):
    # one queue per test: lock retries and redeliveries come back to the test's own workers
    app.conf.task_default_queue = os.environ["CSL_QUEUE"]


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


long_short_ttl = keyed_task(
    "long_short_ttl",
    seconds=30,
    lock_ttl=2,
    on_duplicate="retry",
    lock_retry_backoff=0.1,
    lock_retry_backoff_max=0.5,
)
short_ttl_retry = keyed_task(
    "short_ttl_retry",
    lock_ttl=1,
    on_duplicate="retry",
    lock_retry_backoff=0.1,
    lock_retry_backoff_max=0.5,
)
#: short_ttl_retry held only once a replica acknowledged it (test_sentinel.py's second stream)
short_ttl_retry_replicated = keyed_task(
    "short_ttl_retry_replicated",
    lock_ttl=1,
    on_duplicate="retry",
    lock_retry_backoff=0.1,
    lock_retry_backoff_max=0.5,
    lock_min_replicas=REPLICAS,
)
late_ack_skip = keyed_task(
    "late_ack_skip",
    seconds=6,
    base=RecordsAttempts,
    acks_late=True,
    lock_ttl=2,
    on_duplicate="skip",
)
late_ack_retry = keyed_task(
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
    "late_ack_forgetful", base=RecordsAttempts, acks_late=True, lock_ttl=2, lock_finished_ttl=None
)


# -- tasks for the chaos suite --
# (tests/chaos/test_faults.py; they write to a store on a Redis server of its own, named by
# CSL_STORE_URL: see tests/chaos/fenced_store.py)

from celery_singleton_lock import lock_lost  # noqa: E402

CHAOS_TASKS = ("tests.celery.lockapp.chaos_balance", "tests.celery.lockapp.chaos_stall")

_chaos_client: Optional[redis.Redis] = None
_chaos_pid = 0


def chaos_client() -> redis.Redis:
    """This process's client of the chaos store server (``CSL_STORE_URL``)."""
    global _chaos_client, _chaos_pid
    if _chaos_client is None or _chaos_pid != os.getpid():
        _chaos_client = redis.Redis.from_url(
            os.environ["CSL_STORE_URL"], socket_timeout=5, socket_connect_timeout=2
        )
        _chaos_pid = os.getpid()
    return _chaos_client


def chaos_store(ns: str) -> Any:
    from tests.chaos.fenced_store import FencedStore

    return FencedStore(chaos_client(), ns)


def _stale_fence() -> type[Exception]:
    from tests.chaos.fenced_store import StaleFence

    return StaleFence


class ChaosStaleFence(Exception):
    """Raised by chaos_balance when the store refused its fence: Celery retries it."""


@app.task(
    bind=True,
    base=LockedTask,
    acks_late=True,
    lock_on=("account",),
    lock_fencing=True,
    lock_ttl=3,
    on_duplicate="retry",
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.5,
    autoretry_for=(ChaosStaleFence,),
    max_retries=50,
    default_retry_delay=0.1,
)
def chaos_balance(
    self: LockedTask, account: str, cents: int, ns: str, work: float = 0.05, after: float = 0.0
) -> str:
    """One fenced read-modify-write of ``account`` in the chaos store: claim-read, ``work``
    seconds, write; then ``after`` seconds more under the lock (a window in which a kill finds
    the write applied and the message not yet acknowledged)."""
    fence = self.request.lock.fence
    st = chaos_store(ns)
    st.record_run(account, self.request.id, os.getpid(), fence, self.request.hostname or "?")
    try:
        outcome = str(st.apply(self.request.id, account, cents, fence, work))
    except _stale_fence() as exc:
        raise ChaosStaleFence(str(exc)) from None
    time.sleep(after)
    return outcome


@app.task(
    bind=True,
    base=LockedTask,
    lock_on=("account",),
    lock_fencing=True,
    lock_ttl=1,
    on_duplicate="retry",
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.3,
)
def chaos_stall(
    self: LockedTask, account: str, cents: int, ns: str, go_key: Optional[str] = None
) -> dict[str, Any]:
    """Claim-read ``account``; with ``go_key``, wait (up to 60 s) for that key to exist before
    writing, so the test can stall this process in between. Records in ``<ns>:stall:<id>``
    what the write did and whether the handle said the lock was lost afterwards."""
    handle = self.request.lock
    fence = handle.fence
    st = chaos_store(ns)
    st.record_run(account, self.request.id, os.getpid(), fence, self.request.hostname or "?")
    read = st.claim(self.request.id, account, fence)
    if go_key is not None:
        deadline = time.monotonic() + 60
        while not st.client.exists(go_key) and time.monotonic() < deadline:
            time.sleep(0.05)
    write = "already" if read is None else st.write(self.request.id, account, cents, fence, read)
    # the renewer thread resumed with us: give it a bounded moment to report the loss
    deadline = time.monotonic() + 3
    while not handle.lost and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        handle.check()
        check_raised = ""
    except LockLostError as exc:
        check_raised = type(exc).__name__
    outcome = {"fence": fence, "write": write, "lost": handle.lost, "check_raised": check_raised}
    st.client.hset(
        st.key("stall", self.request.id), mapping={k: str(v) for k, v in outcome.items()}
    )
    return outcome


def _record_chaos_lock_lost(
    sender: Any = None, task_id: Optional[str] = None, key: Optional[str] = None, **_: Any
) -> None:
    if getattr(sender, "name", None) in CHAOS_TASKS and os.environ.get("CSL_STORE_URL"):
        from tests.chaos.fenced_store import LOCK_LOST_LIST

        chaos_client().rpush(LOCK_LOST_LIST, f"{task_id}|{key}|{time.time():.6f}")


lock_lost.connect(_record_chaos_lock_lost, weak=False)


# -- a body that holds the GIL (tests/celery/test_gil_starvation.py) -------------------------

#: Never matches "a" * n + "b"; the regex engine backtracks for a time growing ~1.6x per "a",
#: all in one C call that keeps the GIL.
GIL_PATTERN = r"(a|aa)+$"


@app.task(bind=True, base=LockedTask, lock_on=("key",), lock_ttl=1, on_duplicate="skip")
def holds_the_gil(self: LockedTask, key: str, size: int = 0) -> dict[str, Any]:
    """Records itself as :func:`body` does, holding the GIL for one regex match in between."""
    import re

    r = store()
    if r.incr(f"gauge:{key}") > 1:
        r.incr(f"overlaps:{key}")
    r.rpush(f"runs:{key}", f"{self.request.id}|{os.getpid()}|{time.time()}")
    started = time.monotonic()
    try:
        re.match(GIL_PATTERN, "a" * size + "b")
    finally:
        r.decr(f"gauge:{key}")
    return {"held_gil_s": time.monotonic() - started}


# -- tasks with lock_limit: their own module, registered on this app -------------------------

from tests.celery import limit_tasks as limit_tasks  # noqa: E402
