"""Policy ``queue`` with real ``celery worker`` processes: the acceptance runs of issue 11.

- identical calls on a prefork ``-c 4`` worker run back to back, in arrival order, with no
  lock retry and no overlap (full size: 10 calls of 3 s, at most 33 s);
- many short calls on one key run within 1.3x their summed body time (full size: 200 x 50 ms);
- nothing is lost when the holder's whole worker is killed with ``kill -9`` (the sweeper of
  another worker hands the lock on once it expires), when a pool child holding the lock is
  killed (the main process reclaims it), or when the lock server restarts with AOF.

Reduced sizes by default; ``--full`` runs the issue's sizes. Times are printed (``-s``) and,
at full size only, held to the issue's bounds; at reduced size the tests assert counts and
order, which a noisy machine cannot flake.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
import redis

from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import queueing
from tests.celery.tasks.core import open_gate
from tests.celery.workers import (
    CeleryWorkerProcess,
    Servers,
    lock_key,
    unique,
    worker_group,
)
from tests.support import wait_until


@dataclass(frozen=True)
class Size:
    calls: int
    seconds: float


#: 10 identical calls of 3 s (issue 11: "finish in at most 33 s in arrival order")
IDENTICAL = {"reduced": Size(10, 0.5), "full": Size(10, 3.0)}
#: 200 calls of 50 ms on one key (issue 11: "within 1.3x their summed body time")
SHORT = {"reduced": Size(40, 0.05), "full": Size(200, 0.05)}
#: seconds a holder's body runs while duplicates park behind it, one by one, each through a
#: pool child that may be taking its first call (seconds on a loaded machine): they are all
#: parked before it ends
HOLDS = 8.0


@pytest.fixture(scope="module")
def started(servers: Servers, celery_app: Any) -> Iterator[dict[str, CeleryWorkerProcess]]:
    """The module's workers, started side by side (a start is mostly imports, which two
    cores overlap), each on a queue of its own: ``prefork`` shared by the tests on keys of
    their own, and ``doomed`` and ``restarted``, which one test each stops."""
    with worker_group(servers) as group:
        yield group.start_named(prefork={"concurrency": 4}, doomed={}, restarted={})


@pytest.fixture(scope="module")
def prefork(started: dict[str, CeleryWorkerProcess]) -> CeleryWorkerProcess:
    return started["prefork"]


def size(request: pytest.FixtureRequest, sizes: dict[str, Size]) -> Size:
    return sizes["full" if request.config.getoption("--full") else "reduced"]


def started_order(store: redis.Redis, key: str) -> list[int]:
    return [int(index) for index in store.lrange(f"order:{key}", 0, -1)]


def parked_list(key: str, task: Any = queueing.queued_in_order) -> str:
    return lock_key(task, key, 0) + ":parked"


def send_in_order(
    worker: CeleryWorkerProcess,
    store: redis.Redis,
    key: str,
    calls: int,
    seconds: float,
    first: int = 0,
) -> list[Any]:
    """Send calls ``first``... one by one, each once the one before reached the lock server
    (running or parked): their arrival order is their index order. The first one must
    still be running when the last one parks."""
    results = []
    for index in range(first, first + calls):
        results.append(
            queueing.queued_in_order.apply_async((key, index, seconds), queue=worker.queue)
        )
        if index == 0:
            wait_until(lambda: started_order(store, key) == [0], timeout=20)
        else:
            wait_until(lambda index=index: store.zcard(parked_list(key)) == index, timeout=20)
    return results


def lock_retries(worker: CeleryWorkerProcess) -> int:
    return worker.log().count("lock retry")


def test_identical_calls_on_prefork_run_back_to_back_in_arrival_order(
    prefork: CeleryWorkerProcess, store: redis.Redis, request: pytest.FixtureRequest
) -> None:
    wanted = size(request, IDENTICAL)
    key = unique("k")
    retries_before = lock_retries(prefork)
    started = time.monotonic()
    results = send_in_order(prefork, store, key, wanted.calls, wanted.seconds)
    assert [r.get(timeout=wanted.calls * wanted.seconds + 60) for r in results] == list(
        range(wanted.calls)
    )
    elapsed = time.monotonic() - started
    summed = wanted.calls * wanted.seconds
    print(
        f"\n{wanted.calls} identical calls of {wanted.seconds}s: {elapsed:.2f}s ({summed}s summed)"
    )
    assert started_order(store, key) == list(range(wanted.calls))
    assert int(store.get(f"overlaps:{key}") or 0) == 0
    assert lock_retries(prefork) == retries_before  # handed on, never retried
    if request.config.getoption("--full"):
        assert elapsed <= 1.1 * summed


def test_many_short_calls_on_one_key_run_within_their_summed_time(
    prefork: CeleryWorkerProcess, store: redis.Redis, request: pytest.FixtureRequest
) -> None:
    wanted = size(request, SHORT)
    key = unique("k")
    started = time.monotonic()
    results = [
        queueing.queued_in_order.apply_async((key, index, wanted.seconds), queue=prefork.queue)
        for index in range(wanted.calls)
    ]
    for result in results:
        result.get(timeout=wanted.calls * wanted.seconds * 3 + 60)
    elapsed = time.monotonic() - started
    summed = wanted.calls * wanted.seconds
    starts = sorted(float(run.split(b"|")[2]) for run in store.lrange(f"runs:{key}", 0, -1))
    gaps = sorted(b - a - wanted.seconds for a, b in zip(starts, starts[1:]))
    print(
        f"\n{wanted.calls} calls of {wanted.seconds}s on one key: {elapsed:.2f}s "
        f"({elapsed / summed:.2f}x their summed {summed:.1f}s); hand-off gap median "
        f"{gaps[len(gaps) // 2] * 1000:.1f} ms, p90 {gaps[int(len(gaps) * 0.9)] * 1000:.1f} ms"
    )
    # sent at once: prefork children reach the lock in an order of their own; that the
    # execution order is the arrival order is pinned by the test above and the engine's
    assert sorted(started_order(store, key)) == list(range(wanted.calls))
    assert int(store.get(f"overlaps:{key}") or 0) == 0
    if request.config.getoption("--full"):
        assert elapsed <= 1.3 * summed


def _parked_behind_a_holder(
    worker: CeleryWorkerProcess, store: redis.Redis, key: str, parked: int, seconds: float
) -> tuple[Any, list[Any]]:
    """A holder running for ``seconds`` and ``parked`` duplicates parked behind it."""
    holder = queueing.queued_in_order.apply_async((key, 0, seconds), queue=worker.queue)
    wait_until(lambda: started_order(store, key) == [0], timeout=20)
    duplicates = send_in_order(worker, store, key, parked, 0.05, first=1)
    return holder, duplicates


def test_a_holder_killed_with_its_worker_loses_no_parked_call(
    servers: Servers, started: dict[str, CeleryWorkerProcess], store: redis.Redis
) -> None:
    key, doomed = unique("k"), started["doomed"]
    with worker_group(servers) as group:
        queue = doomed.queue
        _, duplicates = _parked_behind_a_holder(doomed, store, key, parked=4, seconds=30)
        doomed.crash()  # the lock is left to its TTL (5 s)
        store.delete(f"gauge:{key}")  # the killed body never left it
        group.start(1, queue=queue, pool="prefork", concurrency=2)  # its sweeper hands it on
        assert [d.get(timeout=60) for d in duplicates] == [1, 2, 3, 4]
    assert started_order(store, key) == [0, 1, 2, 3, 4]  # the holder's own run was cut short
    assert int(store.get(f"overlaps:{key}") or 0) == 0


def _gated_behind_a_holder(
    worker: CeleryWorkerProcess, store: redis.Redis, key: str, parked: int
) -> tuple[Any, list[Any]]:
    """A holder running until the test opens its gate (``gated_in_order``) and ``parked``
    duplicates parked behind it, one by one (each waits at the gate too once it runs)."""
    task = queueing.gated_in_order
    holder = task.apply_async((key, 0), queue=worker.queue)
    wait_until(lambda: started_order(store, key) == [0], timeout=20)
    duplicates = []
    for index in range(1, parked + 1):
        duplicates.append(task.apply_async((key, index), queue=worker.queue))
        wait_until(lambda index=index: store.zcard(parked_list(key, task)) == index, timeout=20)
    return holder, duplicates


def test_parked_calls_run_after_a_warm_worker_restart(
    servers: Servers, started: dict[str, CeleryWorkerProcess], store: redis.Redis
) -> None:
    key, first = unique("k"), started["restarted"]
    with worker_group(servers) as group:
        queue = first.queue
        holder, duplicates = _gated_behind_a_holder(first, store, key, parked=3)
        first.request_stop()  # warm: the holder ends, and hands the lock on
        wait_until(lambda: "Warm shutdown" in first.log(), timeout=30)
        open_gate(key, count=4)  # the holder's end, then one for each parked call
        assert first.wait_exit(30) == 0
        group.start(1, queue=queue, pool="prefork", concurrency=2)
        assert holder.get(timeout=30) == 0
        assert [d.get(timeout=60) for d in duplicates] == [1, 2, 3]
    assert started_order(store, key) == [0, 1, 2, 3]
    assert int(store.get(f"overlaps:{key}") or 0) == 0


def test_a_killed_pool_child_holding_the_lock_loses_no_parked_call(
    prefork: CeleryWorkerProcess, store: redis.Redis
) -> None:
    key = unique("k")
    holder, duplicates = _parked_behind_a_holder(prefork, store, key, parked=3, seconds=30)
    holder_pid = int(store.lindex(f"runs:{key}", 0).split(b"|")[1])
    os.kill(holder_pid, signal.SIGKILL)  # the main process reclaims its lock
    store.delete(f"gauge:{key}")  # the killed body never left it
    assert [d.get(timeout=60) for d in duplicates] == [1, 2, 3]
    assert started_order(store, key) == [0, 1, 2, 3]
    # WorkerLostError, the killed run itself: stored when Celery reports the death, which can
    # come after the main process already freed the lock and the parked calls ran
    wait_until(lambda: holder.state == "FAILURE", timeout=20)


def test_parked_calls_survive_a_lock_server_restart_with_aof(
    broker_server: RedisServer, celery_app: Any
) -> None:
    with RedisServer.running(extra_args=["--appendonly", "yes", "--appendfsync", "always"]) as aof:
        servers = Servers(
            broker_url=broker_server.url,
            lock=aof,
        )
        store = aof.client()
        key = unique("k")
        with worker_group(servers) as group:
            (worker,) = group.start(1, pool="prefork", concurrency=2)
            holder, duplicates = _parked_behind_a_holder(
                worker, store, key, parked=3, seconds=HOLDS
            )
            aof.restart()
            store = aof.client()
            assert holder.get(timeout=30) == 0
            assert [d.get(timeout=60) for d in duplicates] == [1, 2, 3]
        assert started_order(store, key) == [0, 1, 2, 3]
        assert int(store.get(f"overlaps:{key}") or 0) == 0
