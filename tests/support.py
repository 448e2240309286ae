"""Helpers shared by the tests: a connection that counts round trips, polling with a deadline."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Generic, Iterable, Iterator, TypeVar

import redis

from bench._common import packed_request
from celery_singleton_lock.engine import RedisLocker

T = TypeVar("T")

# Sent by redis-py when it opens a connection; not lock traffic.
HANDSHAKE = frozenset({"HELLO", "CLIENT", "AUTH", "SELECT", "PING"})


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


class CountingConnection(redis.Connection):
    """Counts what the client sends: one entry per round trip, by command name.

    A pipeline counts once, as ``PIPELINE`` (one packed send); commands a Lua script runs
    inside Redis are never seen here. :meth:`about` keeps the round trips that name one lock:
    a test on a worker shared with other tests counts only its own calls' commands (another
    test's call may still end, and release, while it counts).
    """

    lock = threading.Lock()
    sent: list[str] = []
    payloads: list[bytes] = []
    _single = threading.local()

    def send_command(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
        CountingConnection._single.active = True
        try:
            super().send_command(*args, **kwargs)
        finally:
            CountingConnection._single.active = False
        if name.upper() not in HANDSHAKE:
            self._record(name.upper(), b" ".join(_as_bytes(arg) for arg in args))

    def send_packed_command(self, command, check_health=True):  # type: ignore[no-untyped-def]
        if not getattr(CountingConnection._single, "active", False):
            # packed by the caller: one command (the hot path's), or a pipeline's batch
            packed = command if isinstance(command, bytes) else b"".join(map(bytes, command))
            self._record(packed_request(command), packed)
        super().send_packed_command(command, check_health)

    @classmethod
    def _record(cls, name: str, payload: bytes) -> None:
        with cls.lock:
            cls.sent.append(name)
            cls.payloads.append(payload)

    @classmethod
    def reset(cls) -> None:
        with cls.lock:
            cls.sent = []
            cls.payloads = []

    @classmethod
    def about(cls, name: str) -> list[str]:
        """The round trips sent since the last reset whose command names ``name`` (a lock's
        name: its keys carry it), in order."""
        needle = name.encode()
        with cls.lock:
            return [sent for sent, payload in zip(cls.sent, cls.payloads) if needle in payload]

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


#: seconds of a holder's TTL (or a reservation) that a test waits out: long enough that what it
#: does meanwhile (park calls behind it, a sweeper's look that finds it held), a few round trips,
#: certainly comes first on a loaded machine
SHORT_TTL = 2.0


def wait_until_due(locker: RedisLocker, name: str) -> None:
    """Until a sweeper's look finds the lock ``name`` due (a slot's TTL or reservation over)."""
    queue = locker.queue
    assert queue is not None
    wait_until(lambda: name in queue.hand_off_due().names, timeout=SHORT_TTL + 10)


def sleep_for(seconds: float, step: float = 0.05) -> None:
    """Sleep ``seconds`` in short steps (a loop bounded in count and time)."""
    deadline = time.monotonic() + seconds
    for _ in range(int(seconds / step) + 2):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        time.sleep(min(step, remaining))


#: One call of :class:`SideBySide`'s function: positional and keyword arguments.
Call = tuple[tuple[Any, ...], dict[str, Any]]


class SideBySide(Generic[T]):
    """Calls of ``run`` (each a subprocess, mostly one core's import time) that depend on
    nothing a test does first, started together at the first ask, ``at_once`` at a time: a
    test asking for one of ``calls`` gets that call's result; any other call runs on the spot.

    Use as a context manager (a module-scoped fixture's): leaving waits for what still runs.
    """

    def __init__(self, run: Callable[..., T], calls: Iterable[Call], at_once: int = 3) -> None:
        self._run = run
        self._calls = list(calls)
        self._pool = ThreadPoolExecutor(at_once, thread_name_prefix="side-by-side")
        self._started: dict[Any, Future[T]] = {}

    @staticmethod
    def _key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return tuple(map(str, args)), tuple(sorted((k, str(v)) for k, v in kwargs.items()))

    def __call__(self, *args: Any, **kwargs: Any) -> T:
        if not self._started:
            for call_args, call_kwargs in self._calls:
                future = self._pool.submit(self._run, *call_args, **call_kwargs)
                self._started[self._key(call_args, call_kwargs)] = future
        future = self._started.get(self._key(args, kwargs))
        return future.result() if future is not None else self._run(*args, **kwargs)

    def __enter__(self) -> SideBySide[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def side_by_side(
    run: Callable[..., T], calls: Iterable[Call], at_once: int = 3
) -> Iterator[SideBySide[T]]:
    """A fixture body: ``yield from side_by_side(run, calls)``."""
    with SideBySide(run, calls, at_once) as runs:
        yield runs
