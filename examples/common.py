"""Plumbing shared by the examples: server URLs, app settings, child processes, progress bars.

Nothing here is needed to *use* celery-singleton-lock; it only starts and stops the workers and
beats the examples run, always in their own process groups, and always cleans them up.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Optional, Protocol, Sequence, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis

REPO_ROOT = Path(__file__).resolve().parent.parent

# Environment variables the example apps read (the runners set them for their workers; the
# docker-compose.yml sets them for its containers).
ENV_BROKER = "CELERY_BROKER_URL"
ENV_RESULTS = "CELERY_RESULT_BACKEND"
ENV_LOCKS = "SINGLETON_LOCK_URL"
ENV_DATA = "EXAMPLE_DATA_URL"
ENV_NAMESPACE = "EXAMPLE_NAMESPACE"

LOCAL_REDIS = "redis://127.0.0.1:6379/0"


# -- URLs and settings -------------------------------------------------------------------------


def with_db(url: str, db: int) -> str:
    """``url`` (a redis:// URL) pointing at database ``db``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


def redis_db(url: str) -> int:
    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


def redact(url: Optional[str]) -> str:
    """``url`` with any password hidden, for printing."""
    if not url:
        return "-"
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


@dataclass(frozen=True)
class Settings:
    """Where an example app finds its servers, and the namespace its keys and queue live in.

    ``locks`` None means "not configured": the package then uses the broker if it is Redis.
    """

    broker: str
    results: str
    locks: Optional[str]
    data: str
    namespace: str = "example"

    @classmethod
    def from_redis(cls, url: str, namespace: str) -> Settings:
        """One Redis for everything, in four databases: broker, results, locks, example data."""
        base = redis_db(url)
        broker, results, locks, data = (with_db(url, (base + i) % 16) for i in range(4))
        return cls(broker=broker, results=results, locks=locks, data=data, namespace=namespace)

    @classmethod
    def from_env(cls) -> Settings:
        """What the worker processes (and the docker-compose services) are given."""
        default = cls.from_redis(os.environ.get("REDIS_URL", LOCAL_REDIS), "example")
        return cls(
            broker=os.environ.get(ENV_BROKER) or default.broker,
            results=os.environ.get(ENV_RESULTS) or default.results,
            locks=os.environ.get(ENV_LOCKS) or None,
            data=os.environ.get(ENV_DATA) or default.data,
            namespace=os.environ.get(ENV_NAMESPACE) or default.namespace,
        )

    def env(self) -> dict[str, str]:
        values = {
            ENV_BROKER: self.broker,
            ENV_RESULTS: self.results,
            ENV_DATA: self.data,
            ENV_NAMESPACE: self.namespace,
        }
        if self.locks:
            values[ENV_LOCKS] = self.locks
        return values

    def describe(self) -> str:
        return (
            f"broker {redact(self.broker)} | results {redact(self.results)} | "
            f"locks {redact(self.locks) if self.locks else '(the broker)'} | "
            f"data {redact(self.data)}"
        )


def new_namespace(example: str) -> str:
    """A fresh namespace per run: its own queue, lock prefix and data keys."""
    return f"{example}-{uuid.uuid4().hex[:8]}"


def configure_app(app: Any, settings: Settings) -> None:
    """The Celery settings every example uses."""
    app.conf.update(
        broker_url=settings.broker,
        result_backend=settings.results,
        # The lock server: a setting of its own, so it can differ from the broker.
        singleton_lock_url=settings.locks,
        singleton_lock_prefix=f"{settings.namespace}:lock",
        task_default_queue=settings.namespace,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        result_expires=600,
        worker_send_task_events=False,
    )


_clients: dict[tuple[str, int], redis.Redis] = {}


def data_client(url: str) -> redis.Redis:
    """A client of the examples' own Redis database (one per process)."""
    key = (url, os.getpid())
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = redis.Redis.from_url(
            url, socket_timeout=5, socket_connect_timeout=2, decode_responses=True
        )
    return client


def announce_readiness(app: Any, settings: Settings) -> None:
    """Workers add their name to ``<namespace>:ready`` once they consume (``worker_ready``)."""
    from celery.signals import worker_ready

    def ready(sender: Any = None, **_: Any) -> None:
        name = getattr(sender, "hostname", None) or "?"
        data_client(settings.data).sadd(f"{settings.namespace}:ready", name)

    worker_ready.connect(ready, weak=False)


def delete_keys(url: Optional[str], pattern: str, limit: int = 100_000) -> int:
    """Delete the keys matching ``pattern`` (our own namespace only); quiet on errors."""
    if not url:
        return 0
    deleted = 0
    with contextlib.suppress(redis.RedisError, OSError, ValueError):
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=1)
        try:
            batch: list[bytes] = []
            for key in client.scan_iter(match=pattern, count=500):
                batch.append(key)
                if len(batch) >= 500:
                    deleted += int(client.delete(*batch))
                    batch = []
                if deleted >= limit:
                    break
            if batch:
                deleted += int(client.delete(*batch))
        finally:
            client.close()
    return deleted


def delete_queue(broker_url: str, name: str) -> None:
    """Delete this run's queue and exchange from the broker (Redis or RabbitMQ); quiet."""
    from kombu import Connection
    from kombu.exceptions import KombuError

    with Connection(broker_url, connect_timeout=2) as conn:
        errors = (OSError, KombuError, *conn.connection_errors, *conn.channel_errors)
        try:
            conn.ensure_connection(max_retries=1)
            channel = conn.default_channel
            channel.queue_delete(name)
            channel.exchange_delete(name)
        except errors:
            pass


def cleanup(settings: Settings) -> None:
    """Remove what a run left on the servers: its queue, lock keys and data keys.

    (Celery's task results are left to expire: ``result_expires`` is 10 minutes.)
    """
    ns = settings.namespace
    if urlsplit(settings.broker).scheme in ("redis", "rediss", "unix"):
        # kombu's Redis transport: the queue's lists and its binding sets
        for pattern in (f"{ns}", f"{ns}\x06\x16*", f"_kombu.binding*.{ns}"):
            delete_keys(settings.broker, pattern)
    else:
        delete_queue(settings.broker, ns)
    delete_keys(settings.data, f"{ns}:*")
    delete_keys(settings.locks or settings.broker, f"{ns}:lock:*")


# -- command line ---------------------------------------------------------------------------------


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("servers")
    group.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL"),
        help="one Redis for broker/results/locks/data (DB n..n+3); default $REDIS_URL, "
        "else a throwaway embedded redis-server",
    )
    group.add_argument(
        "--broker-url",
        default=os.environ.get(ENV_BROKER),
        help=f"override the broker, e.g. amqp://... (default ${ENV_BROKER})",
    )
    group.add_argument(
        "--result-url",
        default=os.environ.get(ENV_RESULTS),
        help=f"override the result backend (default ${ENV_RESULTS})",
    )
    group.add_argument(
        "--lock-url",
        default=os.environ.get(ENV_LOCKS),
        help=f"override the lock server, singleton_lock_url (default ${ENV_LOCKS})",
    )
    group.add_argument(
        "--data-url",
        default=os.environ.get(ENV_DATA),
        help=f"override the Redis the example records into (default ${ENV_DATA})",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar on stderr (default: when stderr is a terminal)",
    )
    parser.add_argument("--keep-logs", action="store_true", help="keep the worker/beat logs")


def add_worker_arguments(parser: argparse.ArgumentParser, defaults: Any) -> None:
    """``--workers``, ``--concurrency`` and ``--pool``, defaulting to ``defaults``' fields."""
    parser.add_argument(
        "--workers", type=int, default=defaults.workers, help="celery worker processes"
    )
    parser.add_argument(
        "--concurrency", type=int, default=defaults.concurrency, help="slots per worker"
    )
    parser.add_argument("--pool", default=defaults.pool, choices=("prefork", "threads"))


T = TypeVar("T")


def options_from_args(options_class: type[T], args: argparse.Namespace) -> T:
    """An options dataclass filled from the parsed arguments of the same names."""
    names = [f.name for f in dataclasses.fields(options_class)]  # type: ignore[arg-type]
    return options_class(**{name: getattr(args, name) for name in names})


@contextlib.contextmanager
def servers_from_args(args: argparse.Namespace, example: str) -> Iterator[Settings]:
    """Settings for one run; starts an embedded redis-server when no Redis URL was given."""
    namespace = new_namespace(example)
    with contextlib.ExitStack() as stack:
        url = args.redis_url
        overrides = (args.broker_url, args.result_url, args.lock_url, args.data_url)
        if not url and not all(overrides):
            from celery_singleton_lock.testing import RedisServer

            server = stack.enter_context(RedisServer.running())
            url = server.url
            print(f"started an embedded redis-server on {url} ({server.binary})", flush=True)
        base = Settings.from_redis(url or LOCAL_REDIS, namespace)
        yield Settings(
            broker=args.broker_url or base.broker,
            results=args.result_url or base.results,
            locks=args.lock_url or base.locks,
            data=args.data_url or base.data,
            namespace=namespace,
        )


def show_progress(args: argparse.Namespace) -> bool:
    return sys.stderr.isatty() if args.progress is None else bool(args.progress)


# -- signals -------------------------------------------------------------------------------------


class Terminated(SystemExit):
    """SIGTERM/SIGHUP, raised in the main thread so that ``finally`` blocks run."""


@contextlib.contextmanager
def terminate_as_exception() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into ``Terminated`` (Ctrl-C already raises KeyboardInterrupt)."""

    def handler(signum: int, _frame: Any) -> None:
        raise Terminated(128 + signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Ignore Ctrl-C/SIGTERM while a (bounded) cleanup runs, so it cannot be cut short."""
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    try:
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in sigs}
    except ValueError:  # not the main thread: nothing to defer
        yield
        return
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# -- child processes -----------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
try:
    _LIBC: Optional[ctypes.CDLL] = (
        ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    )
except OSError:
    _LIBC = None


def _die_with_parent() -> None:  # runs in the child, between fork and exec
    # A safety net only: should the runner itself be SIGKILLed, the kernel sends its direct
    # children SIGTERM (a worker then shuts its pool down). Normal cleanup is Supervisor.stop.
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    process: Any  # subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    stopped: bool = False

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class ChildDied(RuntimeError):
    pass


@dataclass
class Supervisor:
    """Starts commands in process groups of their own and always stops them.

    ``stop`` sends SIGTERM to each leader only (a Celery worker then shuts down warmly: its pool
    children finish their task), waits a bounded time, then SIGKILLs whole process groups.
    """

    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str]) -> Child:
        log_path = self.log_dir / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115  (closed by stop)
        full_env = {**os.environ, **env}
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), full_env.get("PYTHONPATH", "")) if p
        )
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=str(REPO_ROOT),
            env=full_env,
            start_new_session=True,
            preexec_fn=_die_with_parent if _LIBC is not None else None,
        )
        child = Child(name, process, log_path, log_file)
        self.children.append(child)
        return child

    def check(self) -> None:
        """Raise ``ChildDied`` if a child exited that nobody stopped."""
        for child in self.children:
            if not child.stopped and child.process.poll() is not None:
                raise ChildDied(
                    f"{child.name} exited with code {child.process.returncode}; "
                    f"last lines of {child.log_path}:\n{child.tail()}"
                )

    def stop(self, children: Optional[Sequence[Child]] = None, timeout: float = 10.0) -> None:
        targets = [c for c in (self.children if children is None else children) if not c.stopped]
        with signals_deferred():
            for child in targets:
                if child.process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        child.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and any(c.process.poll() is None for c in targets):
                time.sleep(0.05)
            for child in targets:
                # also the leader's leftovers (pool children, if the leader died first)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.process.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.process.wait(timeout=5)
                child.log_file.close()
                child.stopped = True

    def logs(self, prefix: str) -> list[Path]:
        return [c.log_path for c in self.children if c.name.startswith(prefix)]


def celery_command(app_module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", app_module, *args]


def worker_command(
    app_module: str, hostname: str, *, pool: str, concurrency: int, loglevel: str
) -> list[str]:
    """``celery worker`` for an example: no gossip, mingle or heartbeat (quiet, quick start)."""
    return celery_command(
        app_module,
        "worker",
        f"--hostname={hostname}",
        f"--pool={pool}",
        f"--concurrency={concurrency}",
        f"--loglevel={loglevel}",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    )


def wait_for_workers(
    supervisor: Supervisor,
    settings: Settings,
    expected: int,
    timeout: float = 60.0,
    on_tick: Optional[Callable[[int], None]] = None,
) -> None:
    """Block until ``expected`` workers announced themselves (``announce_readiness``)."""
    client = data_client(settings.data)
    deadline = time.monotonic() + timeout
    while True:
        supervisor.check()
        ready = int(client.scard(f"{settings.namespace}:ready"))
        if on_tick:
            on_tick(ready)
        if ready >= expected:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {ready} of {expected} workers were ready after {timeout}s")
        time.sleep(0.1)


# -- progress ------------------------------------------------------------------------------------


class Progress:
    """A progress bar on stderr: tqdm when installed, else a plain text bar."""

    def __init__(
        self, total: float, desc: str, unit: str = "", enabled: bool = True, integer: bool = True
    ) -> None:
        self.total, self.desc, self.unit, self.enabled = total, desc, unit, enabled
        self.integer = integer
        self._bar: Any = None
        self._last = 0.0
        self._value = 0.0
        if not enabled:
            return
        if not sys.stderr.isatty():
            return  # a log, not a terminal: the plain bar prints its final line only
        try:
            from tqdm import tqdm
        except ImportError:
            return
        tqdm.monitor_interval = 0  # no monitor thread in a process that forks children
        fmt = "{n:.0f}/{total:.0f}" if integer else "{n:.1f}/{total:.0f}"
        self._bar = tqdm(
            total=total,
            desc=desc,
            file=sys.stderr,
            leave=True,
            dynamic_ncols=True,
            bar_format="{l_bar}{bar}| " + fmt + f" {unit} [{{elapsed}}]{{postfix}}",
        )

    def update_to(self, value: float, note: str = "") -> None:
        if not self.enabled:
            return
        self._value = min(value, self.total)
        if self._bar is not None:
            self._bar.n = self._value
            if note:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.refresh()
            return
        now = time.monotonic()
        if now - self._last < 0.25 and value < self.total:
            return
        self._last = now
        self._draw(note)

    def _draw(self, note: str = "", end: str = "") -> None:
        width = 30
        done = int(width * self._value / self.total) if self.total else width
        shown = f"{self._value:.0f}" if self.integer else f"{self._value:.1f}"
        line = f"{self.desc}: |{'#' * done}{'.' * (width - done)}| {shown}/{self.total:.0f} "
        line += f"{self.unit} {note}"
        if sys.stderr.isatty():
            sys.stderr.write("\r" + line.ljust(79) + end)
        elif end:
            sys.stderr.write(line + end)
        sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            self._draw(end="\n")
        self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def log_lines(paths: Sequence[Path]) -> Iterator[str]:
    for path in paths:
        try:
            with open(path, errors="replace") as handle:
                yield from handle
        except OSError:
            continue


# -- running an example ----------------------------------------------------------------------


class Outcome(Protocol):
    """What an example's run returns: printed as text, then as one JSON line."""

    @property
    def exit_code(self) -> int: ...

    def text(self) -> str: ...

    def as_json(self) -> dict[str, Any]: ...


def run_example(
    args: argparse.Namespace,
    example: str,
    run: Callable[[Settings], Outcome],
    *,
    errors: tuple[type[BaseException], ...] = (),
) -> int:
    """Run ``run`` on the servers ``args`` name (an embedded one if none) and return the exit
    code. Every process is stopped on the way out, whatever happens: an interrupt (130), a
    SIGTERM/SIGHUP (128 + signal), or an expected error, ``errors`` included (2, with the
    error on stderr)."""
    expected: tuple[type[BaseException], ...] = (
        *errors,
        ChildDied,
        TimeoutError,
        redis.RedisError,
        OSError,
    )
    with terminate_as_exception():
        try:
            with servers_from_args(args, example) as settings:
                print(f"servers: {settings.describe()}", flush=True)
                outcome = run(settings)
        except KeyboardInterrupt:
            print("interrupted: every process was stopped", file=sys.stderr)
            return 130
        except Terminated as exc:
            print("terminated: every process was stopped", file=sys.stderr)
            return int(exc.code or 1)
        except expected as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print(outcome.text())
    print(json.dumps(outcome.as_json()), flush=True)
    return outcome.exit_code
