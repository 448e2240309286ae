"""A pool child killed (``kill -9``) while its body holds the lock, with real prefork workers of
``tests.celery.childdeathapp`` (issue 30, items 4, 5 and 10):

- the worker's main process sees the child gone at its next look (every
  ``child_renewal.DEATH_CHECK`` seconds), stops renewing its lock and frees it at once, and the
  release's publish wakes the duplicate waiting for it: with ``lock_ttl=1.5`` the duplicate runs
  within ``lock_ttl`` + 1 s of the kill, kill after kill (before: the main process renewed the
  dead child's lock until Celery reported the death, 1.1-4.7 s);
- a ``replace`` call waiting behind the killed holder is sent at once (before: at the end of the
  holder's old TTL, 5.1-5.9 s with ``lock_ttl=6``);
- Celery >= 5.5's soft shutdown (``REMAP_SIGTERM=SIGQUIT``, ``worker_soft_shutdown_timeout``)
  cancels a long ``acks_late`` body and requeues it: its copy runs to the end exactly once, on
  the other worker, never alongside the cancelled body.

The kill-to-start delays are printed (``-s``); the bounds asserted are the issue's, which a
loaded two-core machine keeps with room to spare after the fix.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Iterator

import celery
import pytest
import redis
from celery.result import AsyncResult

from tests.celery import childdeathapp
from tests.celery.workers import CeleryWorkerProcess, Servers, lock_key, unique, worker_group
from tests.support import wait_until

APP = "tests.celery.childdeathapp"
#: kills in a row (issue 30 asks 10 of 10; 3 keep the test short, --full runs 10)
KILLS = {"reduced": 3, "full": 10}
#: kills aimed at the hand-off window in a row (issue 30 asks 10; --full runs them)
AIMED_KILLS = {"reduced": 1, "full": 10}


@pytest.fixture(scope="module")
def started(servers: Servers, celery_app: Any) -> Iterator[list[CeleryWorkerProcess]]:
    """The module's workers, started side by side (a start is mostly imports, which two
    cores overlap): see ``prefork``, ``prefork3`` and ``pair``."""
    with worker_group(servers) as group:
        group.launch(1, pool="prefork", concurrency=2, app=APP)
        group.launch(1, pool="prefork", concurrency=4, app=APP)
        group.launch(2, pool="prefork", concurrency=2, app=APP)  # one queue
        group.wait_ready()
        yield group.workers


@pytest.fixture(scope="module")
def prefork(started: list[CeleryWorkerProcess]) -> CeleryWorkerProcess:
    """A worker shared by the tests, each on keys of its own (a killed child is replaced by
    the pool)."""
    return started[0]


@pytest.fixture(scope="module")
def prefork3(started: list[CeleryWorkerProcess]) -> CeleryWorkerProcess:
    """A worker with room for 3 bodies of a key and the calls parked behind them (4
    children: the hand-off test where two idle children park at once runs on it too)."""
    return started[1]


@pytest.fixture(scope="module")
def pair(started: list[CeleryWorkerProcess]) -> list[CeleryWorkerProcess]:
    """Two workers on one queue, for the one test that kills one of them."""
    return started[2:4]


def _body_pid(key: str) -> int:
    """The pid of the child running the first body of ``key`` (recorded as it started)."""
    return wait_until(lambda: childdeathapp.started(key), timeout=20)[0][1]


def _kill(pid: int) -> float:
    """``kill -9`` of ``pid``; the time of the kill."""
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    return killed_at


def test_a_killed_childs_lock_lets_the_waiting_duplicate_run_within_its_ttl_and_a_second(
    prefork: CeleryWorkerProcess, store: redis.Redis, request: pytest.FixtureRequest
) -> None:
    task = childdeathapp.short_lease
    delays = []
    for _ in range(KILLS["full" if request.config.getoption("--full") else "reduced"]):
        key = unique("k")
        task.apply_async((key, "holder", 60), queue=prefork.queue)
        pid = _body_pid(key)
        duplicate = task.apply_async((key, "duplicate"), queue=prefork.queue)
        time.sleep(1.0)  # the duplicate reaches the other child and waits (or not yet: both fine)
        killed_at = _kill(pid)
        assert duplicate.get(timeout=30) == "duplicate"
        delays.append(childdeathapp.started(key)[1][2] - killed_at)
        assert not store.exists(lock_key(task, key, 0))
    print(f"\nlock_ttl=1.5: the duplicate ran {[round(d, 2) for d in delays]} s after each kill")
    assert all(delay <= task.lock_options.ttl + 1.0 for delay in delays), delays


def test_a_replace_waiter_starts_within_two_seconds_of_the_holder_childs_kill(
    prefork: CeleryWorkerProcess, store: redis.Redis
) -> None:
    task = childdeathapp.replaced
    key = unique("r")
    holder = task.apply_async((key, "v1", 60), queue=prefork.queue)
    pid = _body_pid(key)
    waiting = task.apply_async((key, "v2"), queue=prefork.queue)
    parked = lock_key(task, key, 0) + ":parked"
    wait_until(lambda: store.zrange(parked, 0, -1) == [waiting.id.encode()], timeout=20)
    killed_at = _kill(pid)
    assert waiting.get(timeout=30) == "v2"
    delay = childdeathapp.started(key)[1][2] - killed_at
    print(f"\nreplace, lock_ttl=6: the waiting call started {delay:.2f}s after the kill")
    assert delay <= 2.0
    # WorkerLostError, the killed run itself: stored once Celery reports the death, which can
    # come after the waiting call already ran
    wait_until(lambda: holder.state == "FAILURE", timeout=20)
    assert int(store.get(f"overlaps:{key}") or 0) == 0


def _in_arrival_order(
    store: redis.Redis, parked_key: str, calls: list[AsyncResult]
) -> list[AsyncResult]:
    """``calls`` in the order they reached the lock (its parked set's order), which is the
    order they are handed it in: not always the order they were sent, as two idle children
    park two calls at once, in either order."""
    by_id = {call.id.encode(): call for call in calls}
    return [by_id[task_id] for task_id in store.zrange(parked_key, 0, -1)]


def _hand_offs_after_aimed_kills(
    worker: CeleryWorkerProcess, store: redis.Redis, kills: int
) -> list[float]:
    """``kills`` times: a holder with two calls parked behind it, and its child killed just
    before it sends the first of them; each time, every call runs once, in arrival order, with no
    overlap. The seconds from the holder's end to the next call's start, one per kill."""
    task = childdeathapp.queued
    delays = []
    for _ in range(kills):
        key = unique("q")
        task.apply_async((key, "holder", 2.0), queue=worker.queue)
        _body_pid(key)
        sent = [task.apply_async((key, f"p{i}"), queue=worker.queue) for i in range(2)]
        parked_key = lock_key(task, key, 0) + ":parked"
        wait_until(lambda key=parked_key: store.zcard(key) == 2, timeout=20)
        parked = _in_arrival_order(store, parked_key, sent)
        # aimed at the call handed the lock first, sent by the holder's child: aimed at the
        # other, it would kill the child of the first after its body, whose result would be
        # WorkerLostError
        store.set(childdeathapp.die_before_publishing(parked[0].id), 1)
        arrived = [f"p{sent.index(call)}" for call in parked]  # "p1", "p0" at times on -c 4
        assert [result.get(timeout=45) for result in parked] == arrived
        holder_end = dict(childdeathapp.ended(key))["holder"]
        assert [value for value, _, _ in childdeathapp.started(key)] == ["holder", *arrived]
        delays.append(childdeathapp.started(key)[1][2] - holder_end)
        print(f"\n{worker!r}: parked {', '.join(arrived)}; next start {delays[-1]:.2f}s after")
        assert not store.exists(childdeathapp.die_before_publishing(parked[0].id))  # it died
        assert int(store.get(f"overlaps:{key}") or 0) == 0
    return delays


def test_a_child_killed_between_its_release_and_the_hand_off_stalls_the_next_call_briefly(
    prefork: CeleryWorkerProcess, store: redis.Redis, request: pytest.FixtureRequest
) -> None:
    """Issue 30, item 1: the next parked call starts within ``lock_ttl`` + 3 s of the holder's
    end (before: ``singleton_lock_handoff_timeout``, 60 s), and arrival order holds (once;
    ``--full``: 10 kills in a row, as the issue asks)."""
    kills = AIMED_KILLS["full" if request.config.getoption("--full") else "reduced"]
    delays = _hand_offs_after_aimed_kills(prefork, store, kills)
    assert all(delay <= childdeathapp.queued.lock_options.ttl + 3.0 for delay in delays), delays


def test_a_child_killed_before_the_hand_off_on_a_worker_of_four_children_stalls_it_briefly(
    prefork3: CeleryWorkerProcess, store: redis.Redis, request: pytest.FixtureRequest
) -> None:
    """As the test above on a worker of 4 children, where the two calls sent behind the holder
    are parked by two children at once, either one first: the kill is aimed at the child
    sending the call that reached the lock first, and the calls run in that order."""
    kills = AIMED_KILLS["full" if request.config.getoption("--full") else "reduced"]
    delays = _hand_offs_after_aimed_kills(prefork3, store, kills)
    assert all(delay <= childdeathapp.queued.lock_options.ttl + 3.0 for delay in delays), delays


def test_a_child_killed_between_its_release_and_the_hand_off_of_a_slot_stalls_it_briefly(
    prefork3: CeleryWorkerProcess, store: redis.Redis
) -> None:
    """Issue 30, item 1, with ``lock_limit=3``: the call a dying child's slot was handed to
    starts within ``lock_ttl`` + 3 s of that child's body's end (before: 60 s, while newer
    parked calls ran first); every call runs once, never more than 3 at once."""
    task = childdeathapp.queued3
    key = unique("l")
    for index in range(3):
        task.apply_async((key, f"h{index}", 2.0 + index), queue=prefork3.queue)
    wait_until(lambda: len(childdeathapp.started(key)) == 3, timeout=20)
    parked = [task.apply_async((key, f"p{i}"), queue=prefork3.queue) for i in range(3)]
    parked_key = lock_key(task, key, 0) + ":parked"
    wait_until(lambda: store.zcard(parked_key) == 3, timeout=20)
    store.set(childdeathapp.die_before_publishing(parked[0].id), 1)
    assert sorted(result.get(timeout=45) for result in parked) == ["p0", "p1", "p2"]
    starts = {value: at for value, _, at in childdeathapp.started(key)}
    ends = dict(childdeathapp.ended(key))
    delay = starts["p0"] - ends["h0"]
    print(f"\nlock_limit=3, lock_ttl=6: the slot's parked call started {delay:.2f}s after")
    assert not store.exists(childdeathapp.die_before_publishing(parked[0].id))  # it did die
    assert delay <= task.lock_options.ttl + 3.0
    assert len(starts) == 6  # each once
    intervals = [(starts[v], ends.get(v, starts[v] + 3.0)) for v in starts]
    assert max(sum(a <= at < b for a, b in intervals) for at, _ in intervals) <= 3


def test_a_worker_killed_between_a_release_and_the_hand_off_stalls_the_next_call_briefly(
    pair: list[CeleryWorkerProcess], store: redis.Redis
) -> None:
    """Issue 30, item 1, a whole worker: the one that released dies (main process and child)
    before it publishes; the other worker's sweeper sends the parked call once the short
    reservation runs out, within ``lock_ttl`` + 3 s of the holder's end."""
    task = childdeathapp.queued
    key = unique("w")
    task.apply_async((key, "holder", 2.0), queue=pair[0].queue)
    _body_pid(key)
    parked = task.apply_async((key, "p0"), queue=pair[0].queue)
    parked_key = lock_key(task, key, 0) + ":parked"
    wait_until(lambda: store.zcard(parked_key) == 1, timeout=20)
    store.set(childdeathapp.worker_dies_before_publishing(parked.id), 1)
    assert parked.get(timeout=45) == "p0"
    # the worker that ran the holder is gone (its main process and child)
    wait_until(lambda: any(w.process and w.process.poll() is not None for w in pair), 20)
    delay = childdeathapp.started(key)[1][2] - dict(childdeathapp.ended(key))["holder"]
    print(f"\nqueue, a worker killed: the parked call started {delay:.2f}s after the release")
    assert delay <= task.lock_options.ttl + 3.0
    assert [value for value, _, _ in childdeathapp.started(key)] == ["holder", "p0"]


def test_a_child_killed_between_its_release_and_the_hand_off_stalls_a_replace_waiter_briefly(
    prefork: CeleryWorkerProcess, store: redis.Redis
) -> None:
    """Issue 30, item 1, for ``replace``: the waiting call starts within ``lock_ttl`` + 3 s of
    the holder's end though the child that released died before sending it."""
    task = childdeathapp.replaced
    key = unique("r")
    task.apply_async((key, "holder", 2.0), queue=prefork.queue)
    _body_pid(key)
    waiting = task.apply_async((key, "v2"), queue=prefork.queue)
    parked_key = lock_key(task, key, 0) + ":parked"
    wait_until(lambda: store.zrange(parked_key, 0, -1) == [waiting.id.encode()], timeout=20)
    store.set(childdeathapp.die_before_publishing(waiting.id), 1)
    assert waiting.get(timeout=45) == "v2"
    holder_end = dict(childdeathapp.ended(key))["holder"]
    delay = childdeathapp.started(key)[1][2] - holder_end
    print(f"\nreplace, lock_ttl=6: the waiting call started {delay:.2f}s after the release")
    assert not store.exists(childdeathapp.die_before_publishing(waiting.id))  # it did die
    assert delay <= task.lock_options.ttl + 3.0
    assert int(store.get(f"overlaps:{key}") or 0) == 0


@pytest.mark.skipif(
    celery.VERSION < (5, 5), reason="soft shutdown (worker_soft_shutdown_timeout) is Celery 5.5's"
)
def test_a_task_cancelled_by_a_soft_shutdown_runs_its_requeued_copy_to_the_end_once(
    servers: Servers, store: redis.Redis, celery_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = childdeathapp.long_acks_late
    key = unique("s")
    monkeypatch.setenv("REMAP_SIGTERM", "SIGQUIT")  # read by billiard at import
    monkeypatch.setenv("CSL_SOFT_SHUTDOWN_TIMEOUT", "1")
    with worker_group(servers) as group:
        workers = group.start(
            2, pool="prefork", concurrency=1, app=APP, extra_args=["--prefetch-multiplier", "1"]
        )
        call = task.apply_async((key, "only", 6), queue=workers[0].queue)
        pid = _body_pid(key)
        (running,) = [w for w in workers if pid in w.children()]
        (other,) = [w for w in workers if w is not running]
        stopped_at = time.time()
        running.request_stop()  # SIGTERM, remapped to SIGQUIT: soft shutdown, then cancel
        assert running.wait_exit(30) is not None
        assert call.get(timeout=60) == "only"
        time.sleep(2.0)  # a second copy, if any, would start here
        runs, ends = childdeathapp.started(key), childdeathapp.ended(key)
        print(
            f"\nsoft shutdown: starts {[round(at - stopped_at, 2) for _, _, at in runs]} s, "
            f"ends {[round(at - stopped_at, 2) for _, at in ends]} s after the SIGTERM"
        )
        assert len(runs) == 2  # the cancelled body and its copy
        assert [value for value, _ in ends] == ["only"]  # the copy ran to the end, once
        assert runs[1][1] in other.children()
        assert int(store.get(f"overlaps:{key}") or 0) == 0
        assert call.state == "SUCCESS"
        assert not store.exists(lock_key(task, key, 0))
