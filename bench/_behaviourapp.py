"""The workers' app of ``bench behaviour``: every plugin's tasks, built from the environment.

``celery -A bench._behaviourapp:app worker`` builds it from the ``BENCH_BEHAVIOUR_*``
environment variables the driver (``bench/behaviour.py``) sets; in the driver ``app`` is None
and each phase builds its own with :func:`build_app`. Task bodies record their start and end
(wall clock of this host) in Redis db 0.
"""

from __future__ import annotations

import importlib
import json
import os
import time
import uuid
from typing import Any, Dict, Optional, Tuple

import redis
from celery import Celery

from celery_singleton_lock import LockedTask


def _base(module: str, name: str) -> Tuple[Any, Optional[str]]:
    """A plugin's task base, or None and why it cannot be imported (reported as "n/a")."""
    try:
        return getattr(importlib.import_module(module), name), None
    except Exception as exc:  # noqa: BLE001  (any import failure: reported as "n/a")
        return None, f"{type(exc).__name__}: {exc}"


QueueOnce, ONCE_ERROR = _base("celery_once", "QueueOnce")
Singleton, SINGLETON_ERROR = _base("celery_singleton", "Singleton")

ENV_URL = "BENCH_BEHAVIOUR_URL"  # redis://127.0.0.1:PORT (no db)
ENV_DB = "BENCH_BEHAVIOUR_BROKER_DB"
ENV_REDELIVER = "BENCH_BEHAVIOUR_REDELIVER"
QUEUE = "behaviour"
EVENTS = "bench-behaviour:events"

PLUGINS = ("LockedTask", "celery-once", "celery-singleton")
SHORT = {"LockedTask": "csl", "celery-once": "once", "celery-singleton": "singleton"}

# -- worker side: the task bodies ---------------------------------------------------------------

_clients: Dict[int, redis.Redis] = {}


def _events_client() -> redis.Redis:
    """A client of db 0 for this process (created after the prefork fork)."""
    pid = os.getpid()
    client = _clients.get(pid)
    if client is None:
        client = _clients[pid] = redis.Redis.from_url(f"{os.environ[ENV_URL]}/0")
    return client


def _emit(task: Any, key: str, event: str, nonce: str) -> None:
    record = {
        "event": event,
        "nonce": nonce,
        "task_id": task.request.id,
        "retries": task.request.retries or 0,
        "worker": task.request.hostname,
        "pid": os.getpid(),
        "t": time.time(),
    }
    _events_client().rpush(f"{EVENTS}:{key}", json.dumps(record))


def sleeper(self: Any, key: str, seconds: float) -> str:
    """Record start, sleep ``seconds``, record end."""
    nonce = uuid.uuid4().hex
    _emit(self, key, "start", nonce)
    try:
        time.sleep(seconds)
    finally:
        _emit(self, key, "end", nonce)
    return f"body of {self.request.id}"


def retrier(self: Any, key: str) -> str:
    """First attempt: ``self.retry(countdown=0)``; the retry attempt just records itself."""
    nonce = uuid.uuid4().hex
    _emit(self, key, "start", nonce)
    try:
        if not self.request.retries:
            time.sleep(0.3)
            self.retry(countdown=0, max_retries=2)
    finally:
        _emit(self, key, "end", nonce)
    return f"attempt {self.request.retries} of {self.request.id}"


def build_app(base_url: str, broker_db: int, redeliver: bool = False) -> Celery:
    """The app of one phase: every plugin's tasks, broker in ``broker_db``, the rest in db 0."""
    app = Celery(f"behaviour{broker_db}", set_as_current=False)
    transport: Dict[str, Any] = {}
    if redeliver:  # kombu restores unacked messages older than 2 s, checked every 0.5 s
        transport = {
            "visibility_timeout": 2,
            "unacked_restore_interval": 0.5,
            "unacked_restore_throttle": 1,
        }
    app.conf.update(
        broker_url=f"{base_url}/{broker_db}",
        result_backend=f"{base_url}/0",
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        task_default_queue=QUEUE,
        worker_prefetch_multiplier=1,
        singleton_lock_url=f"{base_url}/0",
        singleton_backend_url=f"{base_url}/0",
        ONCE={
            "backend": "celery_once.backends.Redis",
            "settings": {"url": f"{base_url}/0", "default_timeout": 60 * 60},
        },
    )
    bases: Dict[str, Any] = {"LockedTask": LockedTask}
    short_lock: Dict[str, Dict[str, Any]] = {"LockedTask": {"lock_ttl": 2}}
    common: Dict[str, Dict[str, Any]] = {"LockedTask": {"on_duplicate": "skip"}}
    if QueueOnce is not None:
        bases["celery-once"] = QueueOnce
        short_lock["celery-once"] = {"once": {"timeout": 2}}
        common["celery-once"] = {}
    if Singleton is not None:
        bases["celery-singleton"] = Singleton
        short_lock["celery-singleton"] = {"lock_expiry": 2}
        common["celery-singleton"] = {}
    for plugin, base in bases.items():
        prefix = f"behaviour.{SHORT[plugin]}"
        options = {"base": base, "bind": True, **common[plugin]}
        app.task(sleeper, name=f"{prefix}.body", **options)
        app.task(sleeper, name=f"{prefix}.short", **options, **short_lock[plugin])
        app.task(sleeper, name=f"{prefix}.late", acks_late=True, **options)
        app.task(retrier, name=f"{prefix}.retrying", **options)
    return app


def _app_from_env() -> Optional[Celery]:
    url = os.environ.get(ENV_URL)
    if not url:
        return None
    return build_app(url, int(os.environ[ENV_DB]), os.environ.get(ENV_REDELIVER) == "1")


#: The workers' app (``celery -A bench.behaviour:app``); None in the driver.
app = _app_from_env()
