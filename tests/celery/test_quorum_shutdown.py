"""Workers on a Redlock quorum of 3 lock servers stopped by a cold shutdown while tasks hold
locks (a TTL of a minute): no lock is left on any server once the worker exited (none waits
out its TTL), and none is freed while its body still runs. Real ``celery worker`` processes.

What Celery does (celery/apps/worker.py, in the installed version): SIGQUIT starts a cold
shutdown, which cancels the running tasks through the pool. A prefork pool sends its children
SIGTERM. A threads pool cannot cancel a thread: its ``terminate_job`` raises
``NotImplementedError``, the worker logs "Unrecoverable error" and waits for the bodies. The
second SIGQUIT ("Hitting Ctrl+C again will terminate all running tasks!") raises the same
error again while the worker waits for the pool, and the worker sends ``worker_shutdown`` with
the bodies still running; the interpreter then waits for them (or, when that error cut a
thread's join short, exits without it). The worker's main process releases what is left at
interpreter exit (celery/worker/wiring.py), not at ``worker_shutdown``.
"""

from __future__ import annotations

import signal
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Iterator

import pytest

from tests.celery.test_quorum_workers import (
    APP,
    QuorumServers,
    _closing,
    _lock_keys,
    running_quorum,
    wait_for,
)
from tests.celery.workers import client_app, unique, worker_group

HOLD = f"{APP}.quorum_hold"
#: Seconds each body holds its lock; the worker may take that long to exit (threads).
BODY = 8.0
#: Seconds the worker may take to exit after the last signal.
EXIT_BUDGET = 40.0
#: What the worker says once it handled its first SIGQUIT.
COLD = "Hitting Ctrl+C again will terminate all running tasks"
#: What Celery < 5.5 says at the first SIGQUIT (it has no second step).
COLD_AT_ONCE = "Cold shutdown (MainProcess)"


@pytest.fixture
def quorum_servers() -> Iterator[QuorumServers]:
    with running_quorum() as servers:
        yield servers


@dataclass
class Shutdown:
    #: lock keys left on the quorum's servers once the worker exited
    left: list[str]
    #: times a body was seen still running (no end recorded) with fewer of its locks held
    freed_while_running: int
    log: str


def cold_shutdown(servers: QuorumServers, pool: str, signals: int) -> Shutdown:
    """Start a worker, let two tasks take their locks, send it ``signals`` SIGQUITs (each after
    the worker said it handled the first), and watch the locks until the worker exited."""
    with ExitStack() as stack:
        client = stack.enter_context(_closing(client_app(servers)))
        records = servers.records()
        stack.callback(records.close)
        with worker_group(servers) as workers:
            (worker,) = workers.start(1, pool=pool, concurrency=2)
            keys = [unique("h"), unique("h")]
            for key in keys:
                client.send_task(HOLD, args=(key, BODY), queue=worker.queue)
            started = lambda: all(records.llen(f"runs:{key}") == 1 for key in keys)  # noqa: E731
            assert wait_for(started, 20), worker.log()
            assert len(_lock_keys(servers.quorum)) == 6  # both held on every server
            worker.kill(signal.SIGQUIT)
            for _ in range(signals - 1):
                # Celery 5.5+ waits for a second signal ("Hitting Ctrl+C again..."); older
                # releases go cold at the first ("Cold shutdown"), and wait for the threads
                went = lambda: any(text in worker.log() for text in (COLD, COLD_AT_ONCE))  # noqa: E731
                assert wait_for(went, 10), worker.log()
                if COLD in worker.log():
                    worker.kill(signal.SIGQUIT)
            freed_while_running = 0
            deadline = time.monotonic() + EXIT_BUDGET
            for _ in range(int(EXIT_BUDGET / 0.1) + 1):
                # Locks first, ends after: a body records its end before it releases, so a
                # lock seen free whose body has no end recorded was freed while it ran.
                held = len(_lock_keys(servers.quorum))
                running = sum(1 for key in keys if not records.exists(f"ends:{key}"))
                if held < 3 * running:
                    freed_while_running += 1
                if worker.wait_exit(0.1) is not None or time.monotonic() > deadline:
                    break
            assert worker.wait_exit(1) is not None, worker.log()
            return Shutdown(_lock_keys(servers.quorum), freed_while_running, worker.log())


def test_a_cold_shutdown_of_a_prefork_worker_leaves_no_quorum_lock(
    quorum_servers: QuorumServers,
) -> None:
    outcome = cold_shutdown(quorum_servers, "prefork", signals=1)
    assert outcome.left == [], outcome.log


def test_a_cold_shutdown_of_a_threads_worker_leaves_no_quorum_lock(
    quorum_servers: QuorumServers,
) -> None:
    outcome = cold_shutdown(quorum_servers, "threads", signals=2)
    assert outcome.left == [], outcome.log


def test_a_cold_shutdown_of_a_threads_worker_frees_no_lock_while_its_body_runs(
    quorum_servers: QuorumServers,
) -> None:
    outcome = cold_shutdown(quorum_servers, "threads", signals=2)
    assert outcome.freed_while_running == 0, outcome.log
