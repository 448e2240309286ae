"""Locks on a Redlock quorum of 3 lock servers through outages, from real ``celery worker``s.

3 independent redis-server processes hold the locks (``singleton_lock_url`` a list of their
URLs: tests/celery/quorumapp.py); broker, results and the bodies' records are on a fourth
server, so only lock servers go down. 2 prefork workers run a stream of locked
``quorum_retry`` calls (``on_duplicate="retry"``, ``lock_ttl=1``) over a few keys. A quarter of
the way in one lock server is stopped (a majority is left: work must go on); half-way a second
one (no majority: acquires follow ``lock_on_backend_error="retry"``, nothing may be lost or
fail); three quarters of the way both are restarted, empty (work must resume). Reduced size by
default; ``--full`` runs a longer stream over more keys.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import pytest
import redis
from celery.result import AsyncResult

from celery_singleton_lock.testing import RedisServer
from tests.celery.streams import ran, starts, wait_for
from tests.celery.workers import LocksApart, client_app, close_client, unique, worker_group
from tests.chaos.conftest import chaos_figures  # noqa: F401 (fixture)

APP = "tests.celery.quorumapp"
TASK = f"{APP}.quorum_retry"
#: Seconds every call may take to have run, after the last one was sent.
DRAIN_BUDGET = 60.0


@dataclass
class QuorumServers(LocksApart):
    """Locks on ``quorum``."""

    quorum: list[RedisServer] = field(default_factory=list)

    def lock_env(self) -> dict[str, str]:
        return {"CSL_LOCK_URLS": ",".join(server.url for server in self.quorum)}


@dataclass
class Size:
    calls: int
    keys: int
    body: float  # seconds
    interval: float  # seconds between two sends


REDUCED = Size(calls=60, keys=4, body=0.1, interval=0.1)
FULL = Size(calls=400, keys=8, body=0.1, interval=0.05)


@dataclass
class Stream:
    size: Size
    sent: list[str]
    starts: list[tuple[float, str, str]]  # (time.time(), task id, key) of each body run
    overlaps: int
    states: dict[str, str]
    lock_keys_left: list[str]
    #: time.time() of: one server stopped, a second stopped, before and after both were
    #: restarted (up and answering), the last send
    events: dict[str, float]
    logs: str

    def never_ran(self) -> list[str]:
        return sorted(set(self.sent) - {task_id for _, task_id, _ in self.starts})

    def ran_twice(self) -> list[str]:
        counts = Counter(task_id for _, task_id, _ in self.starts)
        return sorted(task_id for task_id, count in counts.items() if count > 1)

    def not_succeeded(self) -> dict[str, str]:
        return {task_id: state for task_id, state in self.states.items() if state != "SUCCESS"}

    def starts_between(self, begin: str, end: Optional[str]) -> list[float]:
        low, high = self.events[begin], self.events[end] if end else float("inf")
        return [started for started, _, _ in self.starts if low < started <= high]


@pytest.fixture(scope="module")
def stream(request: pytest.FixtureRequest) -> Iterator[Stream]:
    size = FULL if request.config.getoption("--full") else REDUCED
    with ExitStack() as stack:
        plain = stack.enter_context(RedisServer.running())
        quorum = [stack.enter_context(RedisServer.running()) for _ in range(3)]
        servers = QuorumServers(
            broker_url=plain.url,
            lock=plain,
            app=APP,
            quorum=quorum,
        )
        client = client_app(servers)
        records = servers.records()
        try:
            with worker_group(servers) as workers:
                yield run_stream(size, quorum, workers, client, records)
        finally:
            records.close()
            close_client(client)


def run_stream(
    size: Size, quorum: list[RedisServer], workers: Any, client: Any, records: redis.Redis
) -> Stream:
    started = workers.start(2, pool="prefork", concurrency=2)
    queue = started[0].queue
    keys = [unique("r") for _ in range(size.keys)]
    events: dict[str, float] = {}
    sent: list[str] = []
    began = time.monotonic()
    for index in range(size.calls):
        if index == size.calls // 4:
            quorum[0].stop()
            events["one_stopped"] = time.time()
        elif index == size.calls // 2:
            quorum[1].stop()
            events["two_stopped"] = time.time()
        elif index == 3 * size.calls // 4:
            events["restarting"] = time.time()
            quorum[0].restart()
            quorum[1].restart()
            events["restarted"] = time.time()
        key = keys[index % len(keys)]
        sent.append(client.send_task(TASK, args=(key, size.body), queue=queue).id)
        pause = began + (index + 1) * size.interval - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    events["last_sent"] = time.time()
    wait_for(lambda: set(sent) <= ran(records, keys), DRAIN_BUDGET)
    states: dict[str, str] = {}
    for _ in range(100):
        states = {task_id: AsyncResult(task_id, app=client).state for task_id in sent}
        if all(state in ("SUCCESS", "FAILURE") for state in states.values()):
            break
        time.sleep(0.2)
    # a release that found its servers down leaves keys that expire at their TTL (1 s)
    wait_for(lambda: not _lock_keys(quorum), 5.0)
    return Stream(
        size=size,
        sent=sent,
        starts=sorted(starts(records, keys)),
        overlaps=sum(int(records.get(f"overlaps:{key}") or 0) for key in keys),
        states=states,
        lock_keys_left=_lock_keys(quorum),
        events=events,
        logs="\n".join(worker.log() for worker in started),
    )


def _lock_keys(quorum: list[RedisServer]) -> list[str]:
    left = []
    for server in quorum:
        client = server.client()
        try:
            # a lock's keys: the prefix's own (the held index, P:held) are not a lock's
            left += [key.decode() for key in client.scan_iter(match="singleton-lock:{*")]
        finally:
            client.close()
    return sorted(left)


def figures_of(stream: Stream) -> dict[str, Any]:
    """Body runs in each phase (3, 2, 1 lock servers up; runs_1_up are bodies whose acquire
    was under way as the second server stopped), and seconds from the restarted servers
    answering to the next body start."""
    after_restart = stream.starts_between("restarted", None)
    return {
        "calls": len(stream.sent),
        "keys": stream.size.keys,
        "body_runs": len(stream.starts),
        "ran_twice": len(stream.ran_twice()),
        "overlapping_runs": stream.overlaps,
        "states": dict(Counter(stream.states.values())),
        "runs_3_up": len([s for s, _, _ in stream.starts if s <= stream.events["one_stopped"]]),
        "runs_2_up": len(stream.starts_between("one_stopped", "two_stopped")),
        "runs_1_up": len(stream.starts_between("two_stopped", "restarting")),
        "runs_after_restart": len(after_restart),
        "resume_s": round(min(after_restart) - stream.events["restarted"], 2)
        if after_restart
        else None,
        "drain_s": round(stream.starts[-1][0] - stream.events["last_sent"], 2),
        "acquires_retried_on_backend_error": stream.logs.count("; retrying later"),
        "leases_lost": stream.logs.count(" lost: "),
    }


def test_every_call_ran_its_body_exactly_once(stream: Stream, chaos_figures: Any) -> None:  # noqa: F811
    chaos_figures(figures_of(stream))
    assert stream.never_ran() == []
    assert stream.ran_twice() == []


def test_no_two_bodies_of_a_key_ran_at_once(stream: Stream) -> None:
    assert stream.overlaps == 0


def test_no_call_ended_in_failure(stream: Stream) -> None:
    assert stream.not_succeeded() == {}


def test_work_went_on_with_one_lock_server_stopped(stream: Stream) -> None:
    assert stream.starts_between("one_stopped", "two_stopped")


def test_acquires_were_retried_while_two_lock_servers_were_stopped(stream: Stream) -> None:
    assert "; retrying later" in stream.logs


def test_work_resumed_after_the_restart(stream: Stream) -> None:
    assert stream.starts_between("restarted", None)


def test_no_lock_key_is_left_at_the_end(stream: Stream) -> None:
    assert stream.lock_keys_left == []


def test_workers_check_the_eviction_policy_of_every_lock_server(stream: Stream) -> None:
    assert stream.logs.count("singleton locks on redis://127.0.0.1:") >= 1
    assert "could not check the lock server's maxmemory-policy" not in stream.logs
    assert "the worker starts, and until it answers" not in stream.logs  # the start check


@contextmanager
def running_quorum() -> Iterator[QuorumServers]:
    """Broker, results and records on one throwaway server, locks on a quorum of three."""
    with ExitStack() as stack:
        plain = stack.enter_context(RedisServer.running())
        yield QuorumServers(
            broker_url=plain.url,
            lock=plain,
            app=APP,
            quorum=[stack.enter_context(RedisServer.running()) for _ in range(3)],
        )


def test_a_pool_child_killed_holding_a_quorum_lock_has_it_freed_on_every_server() -> None:
    with ExitStack() as stack:
        servers = stack.enter_context(running_quorum())
        quorum = servers.quorum
        client = stack.enter_context(_closing(client_app(servers)))
        records = servers.records()
        stack.callback(records.close)
        with worker_group(servers) as workers:
            (worker,) = workers.start(1, pool="prefork", concurrency=2)
            key = unique("r")
            client.send_task(TASK, args=(key, 30.0), queue=worker.queue)
            assert wait_for(lambda: records.llen(f"runs:{key}") == 1, 20)
            holder_pid = int(records.lindex(f"runs:{key}", 0).decode().split("|")[1])
            assert len(_lock_keys(quorum)) == 3  # held on every server
            os.kill(holder_pid, signal.SIGKILL)
            assert wait_for(lambda: "left by dead process" in worker.log(), 15), worker.log()
            assert _lock_keys(quorum) == []


@contextmanager
def _closing(client: Any) -> Iterator[Any]:
    try:
        yield client
    finally:
        close_client(client)
