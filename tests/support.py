"""Helpers shared by the tests: a connection that counts round trips, polling with a deadline."""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, TypeVar

import redis

from bench._common import packed_request

T = TypeVar("T")

# Sent by redis-py when it opens a connection; not lock traffic.
HANDSHAKE = frozenset({"HELLO", "CLIENT", "AUTH", "SELECT", "PING"})


class CountingConnection(redis.Connection):
    """Counts what the client sends: one entry per round trip, by command name.

    A pipeline counts once, as ``PIPELINE`` (one packed send); commands a Lua script runs
    inside Redis are never seen here.
    """

    lock = threading.Lock()
    sent: list[str] = []
    _single = threading.local()

    def send_command(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
        CountingConnection._single.active = True
        try:
            super().send_command(*args, **kwargs)
        finally:
            CountingConnection._single.active = False
        if name.upper() not in HANDSHAKE:
            self._record(name.upper())

    def send_packed_command(self, command, check_health=True):  # type: ignore[no-untyped-def]
        if not getattr(CountingConnection._single, "active", False):
            # packed by the caller: one command (the hot path's), or a pipeline's batch
            self._record(packed_request(command))
        super().send_packed_command(command, check_health)

    @classmethod
    def _record(cls, name: str) -> None:
        with cls.lock:
            cls.sent.append(name)

    @classmethod
    def reset(cls) -> None:
        with cls.lock:
            cls.sent = []

    @classmethod
    def count(cls) -> int:
        with cls.lock:
            return len(cls.sent)


#: The environment variable :class:`tests.celery.workers.Servers` sets for the ``celery worker``
#: processes it starts; the apps those load read it through :func:`broker_polling`.
BROKER_POLLING_ENV = "CSL_BROKER_POLLING_INTERVAL"


def broker_polling() -> dict[str, float]:
    """``broker_transport_options`` entries of a test worker: kombu's ``polling_interval``
    (the seconds an idle BRPOP on the Redis broker blocks; 1 s by default).

    A worker acts on SIGTERM only once its event loop wakes, which an idle worker does when
    that BRPOP returns: with 1 s, every warm stop of a test worker waited up to a second
    before it began. Messages are delivered as they arrive either way. Empty outside a
    worker process started by the tests.
    """
    raw = os.environ.get(BROKER_POLLING_ENV)
    return {"polling_interval": float(raw)} if raw else {}


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate}")
        time.sleep(interval)


def sleep_for(seconds: float, step: float = 0.05) -> None:
    """Sleep ``seconds`` in short steps (a loop bounded in count and time)."""
    deadline = time.monotonic() + seconds
    for _ in range(int(seconds / step) + 2):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        time.sleep(min(step, remaining))
