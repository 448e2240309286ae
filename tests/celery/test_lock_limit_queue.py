"""``on_duplicate="queue"`` with ``lock_limit``, ``lock_rate`` and ``lock_cooldown`` on real
``celery worker`` processes: parked calls take slots as they free, each runs exactly once."""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Iterator

import pytest
import redis
from celery.exceptions import WorkerLostError

from tests.celery.tasks import limits
from tests.celery.test_cli import cli
from tests.celery.test_lock_limit_processes import RECLAIM_WITHIN, slots_held
from tests.celery.test_lock_rate import CLOCKS, starts
from tests.celery.workers import (
    CeleryWorkerProcess,
    Servers,
    lock_key,
    unique,
    worker_group,
)
from tests.support import wait_until


@pytest.fixture(scope="module")
def started(servers: Servers, celery_app: Any) -> Iterator[dict[str, CeleryWorkerProcess]]:
    """Workers shared by the tests, each on a key of its own, started side by side (a start
    is mostly imports, which two cores overlap), each on a queue of its own: ``prefork`` and
    ``threads`` are never killed (a pool child may be: its worker lives on); ``doomed`` is,
    by the one test that uses it."""
    with worker_group(servers) as group:
        yield group.start_named(
            prefork={"concurrency": 4},
            threads={"pool": "threads", "concurrency": 4},
            doomed={"concurrency": 1},
        )


@pytest.fixture(scope="module")
def prefork(started: dict[str, CeleryWorkerProcess]) -> CeleryWorkerProcess:
    return started["prefork"]


@pytest.fixture(scope="module")
def threads(started: dict[str, CeleryWorkerProcess]) -> CeleryWorkerProcess:
    return started["threads"]


def ran(store: redis.Redis, key: str) -> list[str]:
    """Task ids of the bodies that ran, in start order."""
    return [run.split(b"|")[0].decode() for run in store.lrange(f"runs:{key}", 0, -1)]


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_limit_3_queue_runs_12_calls_once_each_at_most_3_at_once(
    request: pytest.FixtureRequest, store: redis.Redis, pool: str
) -> None:
    key, task = unique("k"), limits.limit3_queue
    worker: CeleryWorkerProcess = request.getfixturevalue(pool)  # 4 slots
    results = [task.apply_async((key, 1.5), queue=worker.queue) for _ in range(12)]
    for result in results:
        result.get(timeout=120)
    ids = ran(store, key)
    assert sorted(ids) == sorted(result.id for result in results)  # all 12, once each
    assert int(store.get(f"most:{key}") or 0) == 3  # at most 3 at once, and 3 reached
    assert store.exists(lock_key(task, key) + ":parked") == 0


def test_a_cap_lowered_while_calls_are_parked_runs_every_call_once_with_no_slot_stranded(
    prefork: CeleryWorkerProcess, store: redis.Redis
) -> None:
    """Issue 28, bug 2: a callable lock_limit lowered from 3 to 1 while calls are parked; no
    slot stays reserved until the hand-off timeout (60 s), so every call ends well before."""
    key, task = unique("k"), limits.live_cap_queue
    parked = lock_key(task, key) + ":parked"
    running = [task.apply_async((key, 6.0), queue=prefork.queue) for _ in range(3)]
    wait_until(lambda: int(store.get(f"gauge:{key}") or 0) == 3, timeout=30)
    waiting = [task.apply_async((key, 0.2), queue=prefork.queue) for _ in range(2)]
    wait_until(lambda: store.zcard(parked) == 2, timeout=30)
    store.set(f"cap:{key}", 1)
    later = [task.apply_async((key, 0.2), queue=prefork.queue) for _ in range(2)]
    wait_until(lambda: store.zcard(parked) == 4, timeout=30)
    results = running + waiting + later
    for result in results:
        result.get(timeout=45)
    assert sorted(ran(store, key)) == sorted(result.id for result in results)
    assert store.exists(parked) == 0 and slots_held(store, task, key) == []


def test_a_tenant_sending_after_a_backlog_starts_within_3_5_s_with_lock_fair_by(
    prefork: CeleryWorkerProcess, store: redis.Redis
) -> None:
    """Issue 31's "fair" acceptance: tenant A sends 20 calls of 1 s, tenant B 2 calls 0.5 s
    later (2 at once): B's calls are served round robin with A's backlog, not behind it (in
    arrival order they would start ~9 s after they were sent)."""
    key, task = unique("k"), limits.fair_limit2_queue
    backlog = [task.apply_async((key, "A", 1.0), queue=prefork.queue) for _ in range(20)]
    time.sleep(0.5)
    sent_at = time.time()
    later = [task.apply_async((key, "B", 1.0), queue=prefork.queue) for _ in range(2)]
    results = backlog + later
    for result in results:
        result.get(timeout=120)
    starts = {
        task_id: float(at)
        for task_id, _, at in (
            entry.decode().split("|") for entry in store.lrange(f"runs:{key}", 0, -1)
        )
    }
    waits = [round(starts[result.id] - sent_at, 2) for result in later]
    print(f"\nlock_fair_by: tenant B's calls started {waits} s after they were sent")
    assert sorted(ran(store, key)) == sorted(result.id for result in results)  # each once
    assert int(store.get(f"most:{key}") or 0) == 2
    assert all(wait <= 3.5 for wait in waits), waits


def test_a_live_cap_of_1_set_while_3_run_lets_no_later_bodies_overlap(
    prefork: CeleryWorkerProcess, store: redis.Redis, servers: Servers
) -> None:
    """Issue 31's "live" acceptance: lock_limit=3, 3 calls of one key running and 3 parked
    behind them; ``celery locks limit TASK 1`` (in this process: the command's own process is
    test_cli.py's) while the 3 run: the parked bodies, which start after it returns, never
    overlap; all 6 run once. (Its own task: a live cap is the task's.)"""
    key, task = unique("k"), limits.live3_queue
    parked = lock_key(task, key) + ":parked"
    # the holders outlast the parking of the others and the command by seconds
    results = [task.apply_async((key, 4.0), queue=prefork.queue) for _ in range(3)]
    wait_until(lambda: int(store.get(f"gauge:{key}") or 0) == 3, timeout=30)
    results += [task.apply_async((key, 2.0), queue=prefork.queue) for _ in range(3)]
    wait_until(lambda: store.zcard(parked) == 3, timeout=30)
    url = servers.lock.url
    try:
        result = cli("--url", url, "limit", task.name, "1")
        assert result.returncode == 0, result.stderr
        set_at = time.time()
        assert int(store.get(f"gauge:{key}") or 0) == 3, "the cap was set after a holder ended"
        for call in results:
            call.get(timeout=120)
    finally:
        cli("--url", url, "limit", task.name, "--reset")
    runs = [entry.decode().split("|") for entry in store.lrange(f"runs:{key}", 0, -1)]
    assert sorted(task_id for task_id, _, _ in runs) == sorted(call.id for call in results)
    later = sorted(float(at) for _, _, at in runs if float(at) > set_at)
    assert len(later) == 3  # the parked calls
    assert all(b - a >= 1.9 for a, b in zip(later, later[1:]))  # one at a time (2 s bodies)


def test_rate_3_per_3s_queue_runs_6_calls_never_more_than_3_starts_in_3s(
    threads: CeleryWorkerProcess, store: redis.Redis
) -> None:
    key, task = unique("k"), limits.rate3_queue
    results = [task.apply_async((key,), queue=threads.queue) for _ in range(6)]
    for result in results:
        result.get(timeout=60)
    times = starts(store, key)
    assert len(times) == 6 and len(set(ran(store, key))) == 6
    assert all(later - first >= 3.0 - CLOCKS for first, later in zip(times, times[3:]))


def test_cooldown_queue_hands_each_parked_call_on_when_the_cooldown_ends(
    threads: CeleryWorkerProcess, store: redis.Redis
) -> None:
    key, task = unique("k"), limits.cooldown1_queue
    results = [task.apply_async((key, 0.2), queue=threads.queue) for _ in range(3)]
    for result in results:
        result.get(timeout=60)
    times = starts(store, key)
    assert len(times) == 3 and len(set(ran(store, key))) == 3
    # each starts after the one before ended (0.2 s) and its cooldown (1 s)
    assert all(later - first >= 1.2 - CLOCKS for first, later in zip(times, times[1:]))


def test_a_slot_of_a_killed_pool_child_is_handed_to_the_parked_call(
    prefork: CeleryWorkerProcess, celery_app: Any, store: redis.Redis
) -> None:
    key, task, worker = unique("k"), limits.limit3_queue, prefork
    holders = [task.apply_async((key, 8), queue=worker.queue) for _ in range(3)]
    wait_until(lambda: len(slots_held(store, task, key)) == 3, timeout=30)
    parked = task.apply_async((key, 0), queue=worker.queue)
    wait_until(lambda: store.zcard(lock_key(task, key) + ":parked") == 1, timeout=30)
    # slot 2: not the lock key itself, which the mutex's hand-off would also find free
    victim = next(h for h in slots_held(store, task, key) if h.key.endswith(":slot:2"))
    (killed,) = (result for result in holders if result.id == victim.task_id)
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(WorkerLostError):
        killed.get(timeout=30)
    parked.get(timeout=RECLAIM_WITHIN)  # before the victim's TTL (5 s) and the others' ends
    assert ran(store, key).count(parked.id) == 1
    others = [result for result in holders if result is not killed]
    assert [result.get(timeout=30)["lost"] for result in others] == [False, False]


def test_a_slot_of_a_killed_worker_is_handed_to_the_parked_call_once_it_expires(
    started: dict[str, CeleryWorkerProcess], store: redis.Redis
) -> None:
    key, task = unique("k"), limits.limit3_queue  # lock_ttl=5
    keeper, doomed = started["threads"], started["doomed"]
    # the doomed call on slot 2: not the lock key, which the mutex's hand-off would find too
    kept = [task.apply_async((key, 15), queue=keeper.queue)]
    wait_until(lambda: len(slots_held(store, task, key)) == 1, timeout=30)
    doomed_call = task.apply_async((key, 60), queue=doomed.queue)
    wait_until(lambda: len(slots_held(store, task, key)) == 2, timeout=30)
    kept.append(task.apply_async((key, 15), queue=keeper.queue))
    wait_until(lambda: len(slots_held(store, task, key)) == 3, timeout=30)
    assert slots_held(store, task, key)[1].task_id == doomed_call.id
    parked = task.apply_async((key, 0), queue=keeper.queue)
    wait_until(lambda: store.zcard(lock_key(task, key) + ":parked") == 1, timeout=30)
    doomed.kill_group(signal.SIGKILL)
    # the doomed slot expires (5 s) and the keeper's sweeper hands it on, before the kept
    # bodies (15 s) free theirs
    parked.get(timeout=5 + 4)
    assert ran(store, key).count(parked.id) == 1
    assert [result.get(timeout=30)["lost"] for result in kept] == [False, False]


@pytest.mark.full
def test_rate_3_per_10s_with_retry_runs_9_calls_never_more_than_3_starts_in_10s(
    worker: Any, store: redis.Redis, unique_key: str, duplicates_seen: list[dict[str, Any]]
) -> None:
    results = [limits.rate3_per_10s_retry.delay(unique_key) for _ in range(9)]
    for result in results:
        result.get(timeout=90)
    times = starts(store, unique_key)
    retries = [seen for seen in duplicates_seen if seen["reason"] == "rate"]
    print(f"9 calls at 3/10s: last start {times[-1] - times[0]:.1f}s after the first", end="")
    print(f", {len(retries)} rate retries")
    assert len(times) == 9
    assert all(later - first >= 10.0 - CLOCKS for first, later in zip(times, times[3:]))
    assert len(retries) <= 12  # 6 wait one window, 3 a second: 9 when each lands on time
