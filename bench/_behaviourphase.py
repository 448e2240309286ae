"""The driver side of ``bench behaviour``: worker processes, a phase's app and workers, and
what the records in Redis say (executions, overlaps, what became of a duplicate)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import redis

from celery_singleton_lock.engine import LockKeys

from ._behaviourapp import ENV_DB, ENV_REDELIVER, ENV_URL, EVENTS, QUEUE, SHORT, build_app

ROOT = Path(__file__).resolve().parents[1]

#: Seconds a worker may take to log "ready." on a busy 2-core machine.
START_TIMEOUT = 60.0

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
            sys.executable, "-m", "celery", "-A", "bench._behaviourapp:app", "worker",
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
        if state in ("FAILURE", "REVOKED"):  # a skip is REVOKED with its DuplicateTaskSkipped
            return f"{state} {type(result.result).__name__}"
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

    def start(self, task: Any, key: str, args: List[Any]) -> Tuple[Sent, Execution]:
        """Send a scenario's first call and wait for its body to start; a refused first call
        fails the scenario (an ``error`` cell, the refusal in its raw line)."""
        sent = send(task, args)
        if sent.refused:
            raise RuntimeError(f"first call: {fate(sent, [])}")
        return sent, self.first_start(key)

    def first_start(self, key: str, timeout: float = 30.0) -> Execution:
        runs = wait_until(lambda: executions(self.client, key), timeout)
        if not runs:
            raise RuntimeError(f"no body started for {key} within {timeout:.0f}s")
        first: Execution = runs[0]
        return first

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
