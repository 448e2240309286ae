"""Behaviour, not speed: LockedTask, celery-once and celery-singleton under the same faults.

``python -m bench behaviour [--quick] [--cap SECONDS] [--keep-logs]``

Every scenario runs real ``celery worker`` subprocesses (prefork, concurrency 2) against a
throwaway ``redis-server`` (broker, result backend, locks and the benchmark's own records).
Task bodies record their start and end (wall clock of this host) in Redis; "concurrent" means
one body started before another one with the same arguments had ended. See bench/README.md.

This module is also the workers' app: ``celery -A bench.behaviour:app worker`` builds it from
the ``BENCH_BEHAVIOUR_*`` environment variables set by the driver.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import redis
from celery import Celery

from celery_singleton_lock import LockedTask
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.testing import RedisServer

try:
    from celery_once import QueueOnce
except Exception as exc:  # noqa: BLE001  (any import failure: reported as "n/a")
    QueueOnce = None
    ONCE_ERROR: Optional[str] = f"{type(exc).__name__}: {exc}"
else:
    ONCE_ERROR = None

try:
    from celery_singleton import Singleton
except Exception as exc:  # noqa: BLE001  (any import failure: reported as "n/a")
    Singleton = None
    SINGLETON_ERROR: Optional[str] = f"{type(exc).__name__}: {exc}"
else:
    SINGLETON_ERROR = None

ROOT = Path(__file__).resolve().parents[1]
ENV_URL = "BENCH_BEHAVIOUR_URL"  # redis://127.0.0.1:PORT (no db)
ENV_DB = "BENCH_BEHAVIOUR_BROKER_DB"
ENV_REDELIVER = "BENCH_BEHAVIOUR_REDELIVER"
QUEUE = "behaviour"
EVENTS = "bench-behaviour:events"

PLUGINS = ("LockedTask", "celery-once", "celery-singleton")
SHORT = {"LockedTask": "csl", "celery-once": "once", "celery-singleton": "singleton"}

#: Seconds a worker may take to log "ready." on a busy 2-core machine.
START_TIMEOUT = 60.0

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

# -- driver side: workers -----------------------------------------------------------------------

_print_lock = threading.Lock()


def say(text: str) -> None:
    with _print_lock:
        print(text, flush=True)


class Worker:
    """One ``celery worker`` subprocess in a session of its own (killed as a group)."""

    def __init__(
        self,
        base_url: str,
        broker_db: int,
        log_dir: str,
        redeliver: bool = False,
        queue: str = QUEUE,
    ):
        short = f"behav{broker_db}-{uuid.uuid4().hex[:6]}"
        self.name = f"{short}@{socket.gethostname()}"
        self.log_path = os.path.join(log_dir, f"{short}.log")
        self.env = {
            **os.environ,
            ENV_URL: base_url,
            ENV_DB: str(broker_db),
            ENV_REDELIVER: "1" if redeliver else "0",
            "PYTHONUNBUFFERED": "1",
        }
        self.args = [
            sys.executable, "-m", "celery", "-A", "bench.behaviour:app", "worker",
            "-P", "prefork", "-c", "2", "-n", f"{short}@%h", "-Q", queue,
            "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "INFO",
        ]  # fmt: skip
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.ready_at: Optional[float] = None

    def launch(self) -> Worker:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.args,
                cwd=str(ROOT),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def is_ready(self) -> bool:
        if self.ready_at is None and f"{self.name} ready." in self.log():
            self.ready_at = time.time()
        return self.ready_at is not None

    def wait_ready(self, timeout: float = START_TIMEOUT) -> Worker:
        deadline = time.monotonic() + timeout
        while not self.is_ready():
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited; log:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {self.name} not ready in {timeout}s: {self.log_path}")
            time.sleep(0.1)
        return self

    def kill_group(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


# -- driver side: observations ------------------------------------------------------------------


@dataclass
class Execution:
    """One run of a task body, from its records in Redis."""

    task_id: str
    retries: int
    worker: str
    start: float
    end: Optional[float] = None


def executions(client: redis.Redis, key: str) -> List[Execution]:
    runs: Dict[str, Execution] = {}
    for raw in client.lrange(f"{EVENTS}:{key}", 0, -1):
        record = json.loads(raw)
        if record["event"] == "start":
            runs[record["nonce"]] = Execution(
                record["task_id"], record["retries"], record["worker"], record["t"]
            )
        elif record["nonce"] in runs:
            runs[record["nonce"]].end = record["t"]
    return sorted(runs.values(), key=lambda run: run.start)


def max_overlap(runs: List[Execution]) -> float:
    """Longest time two of ``runs`` were inside their bodies together (0: never)."""
    best = 0.0
    for i, first in enumerate(runs):
        for second in runs[i + 1 :]:
            end = min(first.end or float("inf"), second.end or float("inf"))
            best = max(best, end - max(first.start, second.start))
    return best


def wait_until(predicate: Callable[[], Any], timeout: float, step: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(step)


def describe_exc(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return f"{type(exc).__name__}({text[:70]})" if text else type(exc).__name__


@dataclass
class Sent:
    """A call through the plugin's normal path (``apply_async``)."""

    task_id: str
    result: Any = None
    error: Optional[BaseException] = None

    @property
    def refused(self) -> bool:
        return self.error is not None or self.result is None or self.result.id is None

    @property
    def folded(self) -> bool:
        """The plugin handed back another task's result instead of sending this one."""
        return not self.refused and self.result.id != self.task_id


def send(task: Any, args: List[Any], **options: Any) -> Sent:
    task_id = uuid.uuid4().hex
    try:
        return Sent(task_id, task.apply_async(args=args, task_id=task_id, **options))
    except Exception as exc:  # noqa: BLE001  (recorded as the outcome)
        return Sent(task_id, None, exc)


def state_of(result: Any) -> str:
    try:
        state = result.state
        if state == "FAILURE":
            return f"FAILURE {type(result.result).__name__}"
        return str(state)
    except Exception as exc:  # noqa: BLE001  (recorded as the outcome)
        return f"? {describe_exc(exc)}"


def fate(sent: Sent, runs: List[Execution]) -> str:
    """What became of a duplicate: ran / refused at send / folded / skipped by worker / ..."""
    if sent.error is not None:
        return f"refused at send: {describe_exc(sent.error)}"
    if sent.refused:
        return f"refused at send: apply_async returned {type(sent.result).__name__}"
    if sent.folded:
        return f"not sent: apply_async returned the running task's id {sent.result.id[:8]}"
    if any(run.task_id == sent.task_id for run in runs):
        return "ran"
    return f"not run; state {state_of(sent.result)}"


def lock_ttl(client: redis.Redis, plugin: str, task: Any, args: List[Any]) -> str:
    """Remaining TTL of the lock ``task(*args)`` takes, as Redis reports it."""
    try:
        if plugin == "LockedTask":
            options = task.lock_options
            key = LockKeys.build(options.prefix, options.keyer.name(tuple(args), {})).lock
        elif plugin == "celery-once":
            key = task.get_key(args, {})
        else:
            key = task.generate_lock(task.name, args, {})
        pttl = client.pttl(key)
    except Exception as exc:  # noqa: BLE001  (recorded as the outcome)
        return f"? {describe_exc(exc)}"
    if pttl == -2:
        return "no lock"
    if pttl == -1:
        return "held, no expiry"
    return f"{pttl / 1000:.1f} s"


@dataclass
class Cell:
    text: str
    raw: str = ""


@dataclass
class Phase:
    """A client app and the workers of one phase (one broker db)."""

    base_url: str
    broker_db: int
    log_dir: str
    redeliver: bool = False
    workers: List[Worker] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.app = build_app(self.base_url, self.broker_db, self.redeliver)
        self.client = redis.Redis.from_url(f"{self.base_url}/0")

    def task(self, plugin: str, kind: str) -> Any:
        return self.app.tasks[f"behaviour.{SHORT[plugin]}.{kind}"]

    def start_workers(self, count: int) -> None:
        fresh = [
            Worker(self.base_url, self.broker_db, self.log_dir, self.redeliver)
            for _ in range(count)
        ]
        self.workers.extend(fresh)
        for worker in fresh:
            worker.launch()
        for worker in fresh:
            worker.wait_ready()

    def kill_workers(self) -> None:
        for worker in self.workers:
            worker.kill_group()

    def deliveries(self, task_id: str) -> int:
        return sum(worker.log().count(f"[{task_id}] received") for worker in self.workers)

    def first_start(self, key: str, timeout: float = 30.0) -> Execution:
        runs = wait_until(lambda: executions(self.client, key), timeout)
        if not runs:
            raise RuntimeError(f"no body started for {key} within {timeout:.0f}s")
        return runs[0]

    def settle(self, key: str, first: Execution, body: float, others: List[Sent]) -> None:
        """Wait for the first body to end, then for any other started body to end."""
        wait_until(
            lambda: executions(self.client, key)[0].end, first.start + body + 15 - time.time()
        )

        def quiet() -> bool:
            runs = executions(self.client, key)
            if any(run.end is None for run in runs):
                return False
            return all(
                sent.refused or sent.folded or state_of(sent.result) not in ("PENDING", "STARTED")
                for sent in others
            )

        wait_until(quiet, body + 5)


def with_args(key: str, seconds: float) -> List[Any]:
    return [key, seconds]


# -- scenarios ----------------------------------------------------------------------------------


def overlap_cell(runs: List[Execution], dup: str, extra: str = "") -> Cell:
    overlap = max_overlap(runs)
    starts = " ".join(f"{run.start - runs[0].start:+.1f}" for run in runs)
    raw = f"bodies={len(runs)} starts(s)=[{starts}] overlap={overlap:.1f}s dup: {dup}{extra}"
    if overlap > 0:
        return Cell(f"YES, {overlap:.1f} s together", raw)
    short = "skipped" if "not run" in dup else ("refused" if "refused" in dup else "not run")
    return Cell(f"NO (dup {short})", raw)


def scenario_short_lock(phase: Phase, plugin: str, run_id: str) -> Cell:
    """1. lock 2 s, body 6 s, duplicate sent 3 s after the first body started."""
    task, key, body = phase.task(plugin, "short"), f"s1-{SHORT[plugin]}-{run_id}", 6.0
    first_sent = send(task, with_args(key, body))
    if first_sent.refused:
        return Cell("error", fate(first_sent, []))
    first = phase.first_start(key)
    time.sleep(max(0.0, first.start + 3.0 - time.time()))
    dup = send(task, with_args(key, body))
    phase.settle(key, first, body, [dup])
    runs = executions(phase.client, key)
    return overlap_cell(runs, fate(dup, runs), f" dup sent at +{3.0:.1f}s")


def scenario_bypass(phase: Phase, plugin: str, run_id: str) -> Cell:
    """3. a copy sent with ``app.send_task`` (as beat does) while the first body runs."""
    task, key, body = phase.task(plugin, "body"), f"s3-{SHORT[plugin]}-{run_id}", 5.0
    first_sent = send(task, with_args(key, body))
    if first_sent.refused:
        return Cell("error", fate(first_sent, []))
    first = phase.first_start(key)
    time.sleep(max(0.0, first.start + 1.0 - time.time()))
    dup_id = uuid.uuid4().hex
    dup = Sent(dup_id, phase.app.send_task(task.name, args=with_args(key, body), task_id=dup_id))
    phase.settle(key, first, body, [dup])
    runs = executions(phase.client, key)
    return overlap_cell(runs, fate(dup, runs))


def scenario_retry(phase: Phase, plugin: str, run_id: str) -> Cell:
    """5. ``self.retry(countdown=0)`` in the body: does the retry attempt run?"""
    task, key = phase.task(plugin, "retrying"), f"s5-{SHORT[plugin]}-{run_id}"
    sent = send(task, [key])
    if sent.refused:
        return Cell("error", fate(sent, []))
    first = phase.first_start(key)
    retried = wait_until(
        lambda: [run for run in executions(phase.client, key) if run.retries >= 1], 12.0
    )
    time.sleep(0.5)
    state = state_of(sent.result)
    ttl = lock_ttl(phase.client, plugin, task, [key])
    seen = f"deliveries={phase.deliveries(sent.task_id)} state {state}"
    if retried:
        delay = retried[0].start - first.start
        raw = f"retry attempt started {delay:.1f}s after the first; {seen}; lock then: {ttl}"
        return Cell(f"retry ran (+{delay:.1f} s)", raw)
    raw = f"no retry attempt within 12s; {seen}; lock then: {ttl}"
    return Cell(f"retry NEVER ran; lock {ttl}", raw)


def scenario_visibility(phase: Phase, plugin: str, run_id: str) -> Cell:
    """6. what the caller of a duplicate gets: ``apply_async`` then ``get(timeout=10)``."""
    task, key, body = phase.task(plugin, "body"), f"s6-{SHORT[plugin]}-{run_id}", 4.0
    first_sent = send(task, with_args(key, body))
    if first_sent.refused:
        return Cell("error", fate(first_sent, []))
    phase.first_start(key)
    time.sleep(0.5)
    notes = []
    cell = ""
    variants = [("default", {})]
    if plugin == "celery-once":
        variants.append(("graceful", {"once": {"graceful": True}}))
    for label, options in variants:
        dup = send(task, with_args(key, body), **options)
        if dup.error is not None:
            outcome = f"apply_async raises {describe_exc(dup.error)}"
            short = f"apply_async raises {type(dup.error).__name__}"
            if len(variants) > 1:
                short = type(dup.error).__name__
        else:
            kind = type(dup.result).__name__
            same = " (the running task's id)" if dup.folded else ""
            began = time.monotonic()
            try:
                value = dup.result.get(timeout=10)
            except Exception as exc:  # noqa: BLE001  (recorded as the outcome)
                took = time.monotonic() - began
                state = state_of(dup.result)
                if type(exc).__name__ == "TimeoutError":
                    outcome = f"{kind}{same}; get() times out after {took:.1f}s, state {state}"
                    short = f"get() hangs, {state}"
                else:
                    outcome = f"{kind}{same}; get() raises {describe_exc(exc)} after {took:.1f}s"
                    short = f"get() raises {type(exc).__name__}"
            else:
                took = time.monotonic() - began
                outcome = f"{kind}{same}; get() returns {value!r} after {took:.1f}s"
                short = f"get() -> {value!r}"[:24] + f" ({took:.0f} s)"
                if dup.folded:
                    short = f"get() -> 1st task's result ({took:.0f} s)"
                elif label == "graceful":
                    short = f"get() -> {value!r}"
        notes.append(f"{label}: {outcome}")
        cell = f"{cell}; graceful: {short}" if cell else short
    phase.settle(key, executions(phase.client, key)[0], body, [])
    return Cell(cell, "; ".join(notes))


def scenario_redelivery(phase: Phase, plugin: str, run_id: str) -> Cell:
    """4. acks_late, visibility_timeout=2, body 6 s, 2 workers: redelivered copy concurrent?"""
    task, key, body = phase.task(plugin, "late"), f"s4-{SHORT[plugin]}-{run_id}", 6.0
    sent = send(task, with_args(key, body))
    if sent.refused:
        return Cell("error", fate(sent, []))
    first = phase.first_start(key)
    phase.settle(key, first, body, [])
    time.sleep(1.0)
    runs = executions(phase.client, key)
    deliveries = phase.deliveries(sent.task_id)
    overlap = max_overlap(runs)
    starts = " ".join(f"{run.start - runs[0].start:+.1f}" for run in runs)
    raw = (
        f"deliveries={deliveries} bodies={len(runs)} starts(s)=[{starts}] "
        f"overlap={overlap:.1f}s final state {state_of(sent.result)}"
    )
    if deliveries < 2:
        return Cell(f"no redelivery seen ({deliveries})", raw)
    if overlap > 0:
        return Cell(f"YES, {len(runs)} bodies/{deliveries} deliv.", raw)
    return Cell(f"NO, {len(runs)} body/{deliveries} deliv.", raw)


def scenario_crash(
    phase: Phase, plugins: List[str], run_id: str, cap: float, cells: Dict[str, Cell]
) -> None:
    """2. kill -9 the whole worker mid-body; fresh worker; a duplicate every 1 s.

    Each plugin gets a worker (and a queue) of its own, so the three run side by side.
    """
    body = 20.0
    keys = {plugin: f"s2-{SHORT[plugin]}-{run_id}" for plugin in plugins}
    tasks = {plugin: phase.task(plugin, "body") for plugin in plugins}
    queues = {plugin: f"{QUEUE}-{SHORT[plugin]}" for plugin in plugins}

    def worker(plugin: str) -> Worker:
        made = Worker(phase.base_url, phase.broker_db, phase.log_dir, queue=queues[plugin])
        phase.workers.append(made)
        return made.launch()

    olds = {plugin: worker(plugin) for plugin in plugins}
    for old in olds.values():
        old.wait_ready()
    firsts = {}
    for plugin in plugins:
        sent = send(tasks[plugin], with_args(keys[plugin], body), queue=queues[plugin])
        if sent.refused:
            cells[plugin] = Cell("error", fate(sent, []))
    for plugin in plugins:
        if plugin not in cells:
            firsts[plugin] = phase.first_start(keys[plugin])
    time.sleep(1.0)
    for plugin in firsts:
        if executions(phase.client, keys[plugin])[0].end is not None:
            raise RuntimeError(f"{plugin}: the first body ended before the kill")
    ttl_at_kill = {p: lock_ttl(phase.client, p, tasks[p], [keys[p], body]) for p in firsts}
    killed: Dict[str, float] = {}
    fresh: Dict[str, Worker] = {}
    for plugin in firsts:
        killed[plugin] = time.time()
        olds[plugin].kill_group()
    for plugin in firsts:
        fresh[plugin] = worker(plugin)
    say(f"  [2] workers killed (kill -9, whole group); fresh ones starting; cap {cap:.0f}s")
    recovered: Dict[str, float] = {}
    sends: Dict[str, int] = dict.fromkeys(firsts, 0)
    last_dup: Dict[str, str] = {}
    start = min(killed.values(), default=time.time())
    while time.time() - start < cap and len(recovered) < len(firsts):
        tick = time.time()
        for plugin in firsts:
            fresh[plugin].is_ready()
            if plugin in recovered:
                continue
            runs = executions(phase.client, keys[plugin])
            runs = [run for run in runs if run.start > killed[plugin]]
            if runs:
                recovered[plugin] = runs[0].start - killed[plugin]
                continue
            dup = send(tasks[plugin], with_args(keys[plugin], body), queue=queues[plugin])
            sends[plugin] += 1
            last_dup[plugin] = fate(dup, [])
        time.sleep(max(0.0, tick + 1.0 - time.time()))
    for plugin in firsts:
        ready = fresh[plugin].ready_at
        common = (
            f"lock TTL at kill {ttl_at_kill[plugin]}; fresh worker ready "
            f"{f'{ready - killed[plugin]:.1f}s after kill' if ready else 'never'}; "
            f"duplicates sent {sends[plugin]}"
        )
        if plugin in recovered:
            cells[plugin] = Cell(
                f"dup ran {recovered[plugin]:.1f} s after kill",
                f"first duplicate body started {recovered[plugin]:.1f}s after kill; {common}",
            )
        else:
            ttl = lock_ttl(phase.client, plugin, tasks[plugin], [keys[plugin], body])
            cells[plugin] = Cell(
                f">{cap:.0f} s; lock TTL left: {ttl}",
                f"no duplicate body within {cap:.0f}s; lock TTL then {ttl}; {common}; "
                f"last duplicate: {last_dup.get(plugin, '-')}",
            )


# -- report -------------------------------------------------------------------------------------

SCENARIOS = [
    ("1", "lock 2 s < body 6 s, dup at +3 s: overlap?"),
    ("2", "kill -9 worker mid-body: a dup runs after"),
    ("3", "send_task copy during a run: overlap?"),
    ("4", "acks_late redelivery (vis. 2 s): overlap?"),
    ("5", "self.retry(countdown=0) in the body"),
    ("6", "caller of a duplicate gets"),
]

LEGEND = """\
Legend (every cell is measured in this run; raw numbers above):
  1  lock TTL 2 s, body 6 s, duplicate (same args, through apply_async) sent 3 s after the
     first body started. "YES, x s together": the duplicate's body ran while the first one
     was still running (its start, recorded in Redis, came before the first body's end),
     for x seconds.
     "NO (dup skipped)": the duplicate was delivered to a worker that did not run its body;
     "NO (dup refused)": apply_async refused to send it.
  2  default lock settings, body 20 s, one worker per plugin: seconds from the kill -9 of
     the whole worker (main process and pool) 1 s into the body until the first duplicate
     body started; duplicates sent every 1 s through apply_async, a fresh worker started
     right after the kill (its start-up time is included). ">N s": none ran within the cap;
     then the lock's remaining TTL as Redis reports it ("held, no expiry" = PTTL -1).
  3  default lock settings, body 5 s; 1 s into it the same call is sent by
     app.send_task(name, args) (what beat does), bypassing the plugin's apply_async; cells
     as in 1.
  4  task with acks_late=True; kombu restores the unacked message after 2 s, 2 workers x 2
     slots. "deliv." = times a worker logged receiving that task id; "bodies" = bodies run;
     YES if two bodies ran at the same time.
  5  bind=True task whose first attempt calls self.retry(countdown=0): did the retry attempt
     run within 12 s; "lock" = the lock's TTL after that (still held => stuck key).
  6  duplicate sent through apply_async 0.5 s into the first body (4 s), then
     AsyncResult.get(timeout=10): what the caller sees, and after how long. celery-once is
     also called with once={'graceful': True} ("graceful:"). A cell "get() hangs, PENDING"
     would mean get() timed out with the duplicate still PENDING."""


def render(cells: Dict[str, Dict[str, Cell]], plugins: List[str]) -> str:
    texts = {
        number: [cells.get(number, {}).get(p, Cell("not run")).text for p in plugins]
        for number, _title in SCENARIOS
    }
    widths = [
        max(len(plugin), *(len(row[i]) for row in texts.values()))
        for i, plugin in enumerate(plugins)
    ]
    label_width = max(len(f"{number} {title}") for number, title in SCENARIOS)

    def line(label: str, values: List[str]) -> str:
        cols = " | ".join(f"{v:<{w}}" for v, w in zip(values, widths))
        return f"{label:<{label_width}} | {cols}".rstrip()

    lines = [
        line("scenario", plugins),
        "-" * label_width + "-+-" + "-+-".join("-" * w for w in widths),
    ]
    for number, title in SCENARIOS:
        lines.append(line(f"{number} {title}", texts[number]))
    lines.append("")
    lines.append("raw:")
    for number, _title in SCENARIOS:
        for plugin in plugins:
            cell = cells.get(number, {}).get(plugin)
            if cell is not None and cell.raw:
                lines.append(f"  [{number}] {plugin}: {cell.raw}")
    return "\n".join(lines)


# -- main ---------------------------------------------------------------------------------------


def run_per_plugin(
    number: str,
    scenario: Callable[[Phase, str, str], Cell],
    phase: Phase,
    plugins: List[str],
    run_id: str,
    cells: Dict[str, Dict[str, Cell]],
) -> None:
    for plugin in plugins:
        began = time.monotonic()
        try:
            cell = scenario(phase, plugin, run_id)
        except Exception as exc:  # noqa: BLE001  (recorded as the outcome)
            cell = Cell(f"error: {type(exc).__name__}", describe_exc(exc))
        cells.setdefault(number, {})[plugin] = cell
        say(f"  [{number}] {plugin}: {cell.text}  ({time.monotonic() - began:.1f}s)")


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench behaviour", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="scenario 2 capped at 20 s")
    parser.add_argument("--cap", type=float, help="scenario 2 cap in seconds (default 40)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the worker logs")
    options = parser.parse_args(argv)
    cap = options.cap or (20.0 if options.quick else 40.0)

    plugins = ["LockedTask"]
    missing = {"celery-once": ONCE_ERROR, "celery-singleton": SINGLETON_ERROR}
    for name, error in missing.items():
        if error is None:
            plugins.append(name)
        else:
            say(f"{name}: n/a ({error})")
    import celery

    say(
        f"behaviour of {', '.join(plugins)}; celery {celery.__version__}, "
        f"{os.cpu_count()} cpus; scenario 2 cap {cap:.0f}s"
    )
    run_id = uuid.uuid4().hex[:6]
    log_dir = tempfile.mkdtemp(prefix="bench-behaviour-")
    cells: Dict[str, Dict[str, Cell]] = {}
    crash_cells: Dict[str, Cell] = {}
    phases: List[Phase] = []
    began = time.monotonic()
    failed = False
    try:
        with RedisServer.running() as server:
            base = f"redis://127.0.0.1:{server.port}"
            say(f"throwaway redis-server on 127.0.0.1:{server.port}; worker logs in {log_dir}")
            crash = Phase(base, 3, log_dir)
            normal = Phase(base, 1, log_dir)
            phases += [crash, normal]

            def crash_run() -> None:
                try:
                    scenario_crash(crash, plugins, run_id, cap, crash_cells)
                except Exception as exc:  # noqa: BLE001  (recorded as the outcome)
                    for plugin in plugins:
                        crash_cells.setdefault(
                            plugin, Cell(f"error: {type(exc).__name__}", describe_exc(exc))
                        )
                finally:
                    crash.kill_workers()

            # scenario 2 mostly waits: it runs beside the others, on a broker db of its own
            crash_thread = threading.Thread(target=crash_run, name="crash", daemon=True)
            crash_thread.start()
            normal.start_workers(2)
            say(f"  2 workers ready ({time.monotonic() - began:.0f}s)")
            run_per_plugin("1", scenario_short_lock, normal, plugins, run_id, cells)
            run_per_plugin("3", scenario_bypass, normal, plugins, run_id, cells)
            run_per_plugin("5", scenario_retry, normal, plugins, run_id, cells)
            run_per_plugin("6", scenario_visibility, normal, plugins, run_id, cells)
            normal.kill_workers()

            late = Phase(base, 2, log_dir, redeliver=True)
            phases.append(late)
            late.start_workers(2)
            say(f"  2 redelivery workers ready ({time.monotonic() - began:.0f}s)")
            run_per_plugin("4", scenario_redelivery, late, plugins, run_id, cells)
            late.kill_workers()

            crash_thread.join(timeout=cap + 120)
            cells["2"] = crash_cells
            for plugin, cell in crash_cells.items():
                say(f"  [2] {plugin}: {cell.text}")
    except Exception as exc:  # noqa: BLE001  (recorded as the outcome)
        failed = True
        say(f"behaviour run failed: {describe_exc(exc)}; worker logs kept in {log_dir}")
    finally:
        for phase in phases:
            phase.kill_workers()
    print()
    print(render(cells, plugins))
    print()
    print(LEGEND)
    print(f"\n(total {time.monotonic() - began:.0f}s)")
    if options.keep_logs or failed:
        print(f"worker logs: {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 1 if failed else 0
