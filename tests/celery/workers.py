"""Real ``celery worker`` processes for the integration tests (prefork, threads, solo).

A :class:`CeleryWorkerProcess` runs ``celery -A tests.celery.lockapp worker`` as a child of
the test, in a session (process group) of its own, configured through the ``CSL_*``
environment variables that ``lockapp`` reads. Each worker logs to a file of its own and
consumes one named queue, so tests sharing a broker never take each other's messages.

Everything here is bounded: every wait has a deadline, every loop a count, and a worker is
always killed (its whole process group) when its context manager, its :class:`WorkerGroup`
or the fixture that made it ends.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import redis
from celery import Celery

from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.testing import RedisServer, free_port
from tests.support import BROKER_POLLING_ENV

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.celery.lockapp"

#: Seconds a worker may take to log "ready." (imports, forking the pool, connecting).
START_TIMEOUT = 45.0
#: Seconds a warm shutdown may take before the worker is killed.
STOP_TIMEOUT = 15.0
#: Seconds an idle worker's BRPOP on the broker blocks (tests.support.broker_polling): how
#: long a warm stop may wait before the worker notices it.
BROKER_POLLING_INTERVAL = 0.1


#: Workers started and not yet cleaned up: killed at interpreter exit if a test run is cut
#: short before its finalizers ran.
_live: set[CeleryWorkerProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    for worker in list(_live):
        worker.kill_group(signal.SIGKILL)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def lock_key(task: Any, *args: Any, **kwargs: Any) -> str:
    """The Redis key of the lock a call of ``task`` takes (default prefix of ``lockapp``)."""
    options = task.lock_options
    return LockKeys.build(options.prefix, options.keyer.name(args, kwargs)).lock


def children_of(pid: int) -> list[int]:
    """Direct child pids of ``pid`` (from ``/proc``; empty when it is gone)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                found.extend(int(part) for part in f.read().split())
    return sorted(set(found))


def results_url(broker_url: str) -> str:
    """Where the tests' apps store results: the broker server's database 1."""
    return broker_url.replace("/0", "/1")


@dataclass
class Servers:
    """The servers one test module's workers talk to (results: :func:`results_url` of the
    broker unless ``backend_url`` is given)."""

    broker_url: str
    lock: RedisServer
    backend_url: str = ""
    visibility_timeout: Optional[float] = None
    #: the app module the workers load (``-A``)
    app: str = APP

    def __post_init__(self) -> None:
        self.backend_url = self.backend_url or results_url(self.broker_url)

    def env(self, queue: str, **extra: str) -> dict[str, str]:
        env = {
            **os.environ,
            "CSL_BROKER_URL": self.broker_url,
            "CSL_BACKEND_URL": self.backend_url,
            "CSL_LOCK_URL": self.lock.url,
            "CSL_QUEUE": queue,
            "PYTHONUNBUFFERED": "1",
            BROKER_POLLING_ENV: str(BROKER_POLLING_INTERVAL),
        }
        env.pop("CSL_VISIBILITY_TIMEOUT", None)
        if self.visibility_timeout is not None:
            env["CSL_VISIBILITY_TIMEOUT"] = str(self.visibility_timeout)
        env.update(extra)
        return env


@dataclass
class MetricsServers(Servers):
    """:class:`Servers` of workers of ``tests.celery.metricsapp``: the port they serve
    ``/metrics`` on and their multiprocess folder."""

    metrics_port: int = 0
    metrics_dir: str = ""

    @classmethod
    def of(cls, broker: RedisServer, lock: RedisServer, metrics_dir: str) -> MetricsServers:
        """Workers of ``metricsapp`` on these servers, serving ``/metrics`` on a free port."""
        return cls(
            broker_url=broker.url,
            lock=lock,
            app="tests.celery.metricsapp",
            metrics_port=free_port(),
            metrics_dir=metrics_dir,
        )

    def env(self, queue: str, **extra: str) -> dict[str, str]:
        return super().env(
            queue,
            CSL_METRICS_PORT=str(self.metrics_port),
            CSL_METRICS_DIR=self.metrics_dir,
            **extra,
        )


class LocksApart(Servers):
    """Broker, results and the bodies' records on ``lock`` (a plain server, records in its
    db 2); the locks on the servers :meth:`lock_env` names (a Sentinel group, a Cluster, a
    quorum), which the tests fail over or stop."""

    @property
    def records_url(self) -> str:
        return self.lock.url.replace("/0", "/2")

    def records(self) -> redis.Redis:
        """A client of the records (the caller closes it)."""
        return redis.Redis.from_url(self.records_url, socket_timeout=5)

    def lock_env(self) -> dict[str, str]:
        """The workers' settings of the lock servers."""
        raise NotImplementedError

    def env(self, queue: str, **extra: str) -> dict[str, str]:
        settings = {"CSL_RECORDS_URL": self.records_url, **self.lock_env(), **extra}
        return super().env(queue, **settings)


class CeleryWorkerProcess:
    """One ``celery worker`` subprocess; see the module docstring.

    Args:
        servers: broker, result backend and lock server URLs.
        queue: the only queue it consumes (also its ``task_default_queue``, so lock retries
            and redeliveries come back to it).
        pool: ``prefork``, ``threads``, ``solo`` (or ``gevent``).
        concurrency: pool size (ignored by ``solo``).
        app: the module ``celery -A`` imports (default: the servers' ``app``).
        heartbeat: send worker heartbeats (their events enable the event dispatcher, which
            ``celery control enable_events`` needs to turn task events on).
    """

    def __init__(
        self,
        servers: Servers,
        *,
        queue: str,
        pool: str = "prefork",
        concurrency: int = 2,
        extra_args: Sequence[str] = (),
        log_dir: Optional[str] = None,
        app: Optional[str] = None,
        heartbeat: bool = False,
    ) -> None:
        self.servers = servers
        self.heartbeat = heartbeat
        self.app = app or servers.app
        self.queue = queue
        self.pool = pool
        self.concurrency = concurrency
        self.extra_args = list(extra_args)
        short = unique("csl")
        self.name = f"{short}@{socket.gethostname()}"
        self._log_dir = log_dir or tempfile.mkdtemp(prefix="csl-worker-")
        self.log_path = os.path.join(self._log_dir, f"{short}.log")
        self.process: Optional[subprocess.Popen[bytes]] = None
        self._log_file: Any = None

    # -- life cycle ---------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        assert self.process is not None, "worker not started"
        return self.process.pid

    def launch(self) -> CeleryWorkerProcess:
        """Start the process without waiting for it to be ready (see :meth:`wait_ready`)."""
        assert self.process is None, "already started"
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            self.app,
            "worker",
            "-P",
            self.pool,
            "-c",
            str(self.concurrency),
            "-n",
            self.name.split("@")[0] + "@%h",
            "-Q",
            self.queue,
            *([] if self.heartbeat else ["--without-heartbeat"]),
            "--without-mingle",
            "--without-gossip",
            "-l",
            "INFO",
            *self.extra_args,
        ]
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 (closed in _cleanup)
        self.process = subprocess.Popen(
            args,
            cwd=str(ROOT),
            env=self.servers.env(self.queue),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _live.add(self)
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT) -> CeleryWorkerProcess:
        """Wait for the worker's "<name> ready." log line (its consumer is up)."""
        deadline = time.monotonic() + timeout
        marker = f"{self.name} ready."
        for _ in range(int(timeout / 0.05) + 1):
            if marker in self.log():
                return self
            if self.process is not None and self.process.poll() is not None:
                self._cleanup()
                raise RuntimeError(
                    f"worker {self.name} exited with {self.process.returncode} before it was "
                    f"ready; log:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self._cleanup()
        raise RuntimeError(f"worker {self.name} not ready within {timeout}s:\n{self.log_tail()}")

    def start(self, timeout: float = START_TIMEOUT) -> CeleryWorkerProcess:
        return self.launch().wait_ready(timeout)

    def ping(self, client: Celery, timeout: float = 1.0) -> bool:
        """True if the worker answers a control ping (through the broker)."""
        replies = client.control.ping(destination=[self.name], timeout=timeout)
        return any(self.name in reply for reply in replies or [])

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def children(self) -> list[int]:
        """Pids of the pool processes (prefork), from ``/proc``."""
        return children_of(self.pid) if self.running else []

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the main process only."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill_children(self, sig: int = signal.SIGKILL) -> list[int]:
        """Send ``sig`` to every pool child; returns their pids."""
        pids = self.children()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the worker's whole process group (main process and pool)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def crash(self) -> None:
        """``kill -9`` of the whole worker (main process and pool), reaped: what an OOM kill or
        a lost machine leaves, its messages unacknowledged and its locks to their TTL."""
        self._cleanup()  # SIGKILL to the process group, then wait for the main process

    def wait_exit(self, timeout: float) -> Optional[int]:
        """Wait up to ``timeout`` seconds for the main process to exit; its return code."""
        if self.process is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(timeout=timeout)
        return None

    def request_stop(self) -> None:
        """Ask for a warm shutdown (SIGTERM: finish running tasks, then exit)."""
        self.kill(signal.SIGTERM)

    def stop(self, timeout: float = STOP_TIMEOUT) -> Optional[int]:
        """Warm shutdown; SIGKILL to the whole group if it takes longer than ``timeout``."""
        if self.process is None:
            return None
        self.request_stop()
        code = self.wait_exit(timeout)
        self._cleanup()
        return code

    def _cleanup(self) -> None:
        """Kill whatever is left of the process group; always safe to call."""
        if self.process is not None:
            self.kill_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
        _live.discard(self)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    # -- logs ---------------------------------------------------------------------------------

    def log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def count_in_log(self, text: str) -> int:
        return self.log().count(text)

    def __enter__(self) -> CeleryWorkerProcess:
        if self.process is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<CeleryWorkerProcess {self.name} {self.pool}x{self.concurrency} {state}>"


@dataclass
class WorkerGroup:
    """The workers one test started; stops (and kills) all of them at the end."""

    servers: Servers
    workers: list[CeleryWorkerProcess] = field(default_factory=list)
    log_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="csl-workers-"))

    def start(self, count: int = 1, **options: Any) -> list[CeleryWorkerProcess]:
        """Start ``count`` workers (``options`` as :meth:`launch` takes them), in parallel."""
        started = self.launch(count, **options)
        for worker in started:
            worker.wait_ready()
        return started

    def start_named(self, **kinds: dict[str, Any]) -> dict[str, CeleryWorkerProcess]:
        """One worker per keyword, each on a queue of its own (its options as :meth:`launch`
        takes them), started side by side: name -> worker."""
        launched = {name: self.launch(1, **options)[0] for name, options in kinds.items()}
        for worker in launched.values():
            worker.wait_ready()
        return launched

    def launch(
        self,
        count: int = 1,
        *,
        queue: Optional[str] = None,
        pool: str = "prefork",
        concurrency: int = 2,
        extra_args: Sequence[str] = (),
        app: Optional[str] = None,
    ) -> list[CeleryWorkerProcess]:
        """Launch ``count`` workers on ``queue`` (a fresh one by default) without waiting for
        them to be ready: workers of several kinds then start side by side (mostly import
        time, which two cores overlap); :meth:`wait_ready` before use."""
        queue = queue or unique("q")
        started = [
            CeleryWorkerProcess(
                self.servers,
                queue=queue,
                pool=pool,
                concurrency=concurrency,
                extra_args=extra_args,
                log_dir=self.log_dir,
                app=app,
            )
            for _ in range(count)
        ]
        self.workers.extend(started)
        for worker in started:
            worker.launch()
        return started

    def wait_ready(self) -> None:
        """Wait for every worker launched and still running to be ready."""
        for worker in self.workers:
            if worker.running:
                worker.wait_ready()

    def stop_all(self, timeout: float = STOP_TIMEOUT) -> None:
        for worker in self.workers:
            if worker.running:
                worker.request_stop()
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            worker.wait_exit(max(0.0, deadline - time.monotonic()))
            worker._cleanup()

    def kill_all(self) -> None:
        """SIGKILL every worker's process group at once (nothing is finished or acked)."""
        for worker in self.workers:
            worker.kill_group(signal.SIGKILL)
        for worker in self.workers:
            worker._cleanup()

    def logs(self) -> str:
        return "\n".join(f"===== {w!r} =====\n{w.log_tail(80)}" for w in self.workers)


def client_app(servers: Servers, queue: Optional[str] = None) -> Celery:
    """A Celery app for the test process: sends by task name, reads results."""
    client = Celery(unique("csl-client"))
    client.conf.update(
        broker_url=servers.broker_url,
        result_backend=servers.backend_url,
        broker_connection_retry_on_startup=True,
        task_default_queue=queue or "celery",
        result_backend_transport_options={
            "retry_policy": {"max_retries": 2, "interval_start": 0, "interval_step": 0.2}
        },
    )
    return client


def close_client(client: Celery) -> None:
    """Close a client app before its servers go (as tests/celery/conftest.py does).

    Results collected later would unsubscribe from a dead server, and a result consumer left
    subscribed keeps reconnecting.
    """
    gc.collect()
    consumer = getattr(client.backend, "result_consumer", None)
    if consumer is not None:
        with contextlib.suppress(Exception):
            consumer.stop()
        consumer._pubsub = None
        consumer.subscribed_to = set()
    with contextlib.suppress(Exception):
        client.close()


@contextlib.contextmanager
def worker_group(servers: Servers) -> Iterator[WorkerGroup]:
    group = WorkerGroup(servers)
    try:
        yield group
    finally:
        group.stop_all()
        # shown by pytest only when the test failed
        print(group.logs())
        shutil.rmtree(group.log_dir, ignore_errors=True)
