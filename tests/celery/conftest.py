"""Real servers and a real in-process worker for the Celery-layer tests.

Servers and the worker live for the whole session (starting a worker costs seconds); every
test uses keys of its own (``unique_key``), so tests never see each other's locks.

The worker is Celery's own pytest fixture ``celery_session_worker`` (active with the
pytest-celery plugin), serving ``tests.celery.lockapp`` — the app the subprocess workers of
``workers.py`` import too — through the ``celery_session_app`` override below. ``celery_app``
and ``worker`` are this suite's names for the two.
"""

from __future__ import annotations

import gc
import uuid
from typing import Any, Iterator

import pytest
import redis
from celery import Celery

from celery_singleton_lock.celery.config.lockers import forget_locker, locker_for
from celery_singleton_lock.engine import LockKeys, RedisLocker
from celery_singleton_lock.testing import RedisServer
from tests.celery.registration import app_with
from tests.celery.workers import Servers, results_url
from tests.support import CountingConnection, wait_until


@pytest.fixture(scope="session")
def broker_server() -> Iterator[RedisServer]:
    with RedisServer.running() as server:
        yield server


@pytest.fixture(scope="session")
def lock_server() -> Iterator[RedisServer]:
    with RedisServer.running() as server:
        yield server


@pytest.fixture(scope="session")
def servers(broker_server: RedisServer, lock_server: RedisServer) -> Servers:
    """The session's servers as ``celery worker`` subprocesses are told them (workers.py); a
    module with servers of its own overrides it."""
    return Servers(
        broker_url=broker_server.url,
        lock=lock_server,
    )


@pytest.fixture(scope="session")
def celery_session_app(broker_server: RedisServer, lock_server: RedisServer) -> Iterator[Any]:
    # Imported here, not at the top: this conftest loads before the session starts, and at
    # session start pytest reads every name of pytest-celery's plugin module, among them
    # shared-task proxies (celery.contrib.testing.tasks) that finalize the *current* app.
    # Were lockapp imported by then, all its tasks would be bound before configure() below
    # (what a task reads at binding is the app's own definition: tasks/core.py).
    from tests.celery import lockapp

    assert not lockapp.app.finalized, "lockapp was finalized before it was configured"
    lockapp.configure(
        broker_url=broker_server.url,
        backend_url=results_url(broker_server.url),
        lock_url=lock_server.url,
        singleton_lock_redis_options={"connection_class": CountingConnection},
        # a call may come with serializer="pickle" (a re-send keeps it); only this worker in
        # the test process accepts it: `celery worker` refuses pickle as root
        accept_content=["json", "pickle"],
    )
    forget_locker(lockapp.app)
    yield lockapp.app
    # Before the servers go: results collected later would unsubscribe from a dead server,
    # and a result consumer left subscribed keeps reconnecting.
    gc.collect()
    consumer = getattr(lockapp.app.backend, "result_consumer", None)
    if consumer is not None:
        consumer.stop()
        consumer._pubsub = None
        consumer.subscribed_to = set()
    forget_locker(lockapp.app)


@pytest.fixture(scope="session")
def celery_app(celery_session_app: Any) -> Any:
    """``lockapp.app``, for the whole session (Celery's own ``celery_app`` is a fresh app per
    test, which the subprocess workers could not import)."""
    return celery_session_app


@pytest.fixture(scope="session")
def celery_worker_pool() -> str:
    # threads: several tasks at once, and the lock signals reach the test in this process
    return "threads"


@pytest.fixture(scope="session")
def celery_worker_parameters() -> dict[str, Any]:
    return {
        "concurrency": 4,
        # the ping task is not registered on lockapp.app
        "perform_ping_check": False,
        "loglevel": "WARNING",
        "shutdown_timeout": 15,
        # as -E: our lock events are sent only by a worker that sends task events
        "task_events": True,
    }


@pytest.fixture(scope="session")
def worker(celery_session_worker: Any) -> Any:
    """A real worker in this process (threads pool, 4 slots): signals reach the test."""
    return celery_session_worker


@pytest.fixture
def locker(celery_app: Any) -> RedisLocker:
    return locker_for(celery_app)


@pytest.fixture
def store(lock_server: RedisServer) -> redis.Redis:
    return lock_server.client()


@pytest.fixture
def unique_key() -> str:
    return f"k-{uuid.uuid4().hex[:12]}"


def lock_key_of(task: Any, *args: Any, **kwargs: Any) -> str:
    """The Redis key of the lock a call of ``task`` takes."""
    name = task.lock_options.keyer.name(args, kwargs)
    return locker_for(task.app).keys(name).lock


def lock_gone(store: redis.Redis, key: str) -> bool:
    """Nothing holds the lock ``key``: neither its key nor its slot table (a lock_limit, a
    rate or policy queue keep their slots there, engine/slots.py)."""
    return not store.exists(key, *LockKeys(key, "").slot_table)


def assert_released(store: redis.Redis, key: str, timeout: float = 5.0) -> None:
    """The lock ``key`` is gone, now or within ``timeout``: a task without successors sends
    its release without waiting for the reply, so a test can look a moment too early."""
    wait_until(lambda: lock_gone(store, key), timeout=timeout, interval=0.005)


@pytest.fixture
def own_app(redis_server: RedisServer) -> Iterator[Celery]:
    """A fresh Celery app whose broker and lock server are this test's own ``redis_server``
    (a worker node it pings answers only if it is really there)."""
    app = Celery("own-app", broker=redis_server.url, set_as_current=False)
    app.conf.singleton_lock_url = redis_server.url
    yield app
    app.close()


@pytest.fixture
def registration_app() -> Iterator[Any]:
    """An app with a result backend (a join task needs one) on which tasks are only
    registered (tests/celery/registration.py)."""
    app = app_with(result_backend="cache+memory://")
    yield app
    app.close()


@pytest.fixture
def duplicates_seen() -> Iterator[list[dict[str, Any]]]:
    """The keyword arguments of every ``lock_duplicate`` sent while the test runs (an
    in-process worker's)."""
    from celery_singleton_lock.celery import lock_duplicate

    seen: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        seen.append(kwargs)

    lock_duplicate.connect(receiver, weak=False)
    yield seen
    lock_duplicate.disconnect(receiver)
