"""``celery locks pause`` / ``resume`` and ``self.request.lock.pause_for`` on real ``celery
worker`` processes and a real Redis: while a task's (or group's) name is paused no body of it
starts, and each call follows its ``on_duplicate`` policy (latest wins too: the newest call
runs once the pause ends; a call parked by a pause says reason "paused"). Each test pauses a
task of its own (tests/celery/tasks/pausing.py): a pause stops every call of its task."""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest
import redis

from celery_singleton_lock import DuplicateTaskSkipped
from celery_singleton_lock.celery import lock_duplicate
from celery_singleton_lock.engine import RedisLocker
from tests.celery import latestapp
from tests.celery.tasks import pausing
from tests.celery.test_cli import cli, run_cli
from tests.celery.workers import (
    CeleryWorkerProcess,
    Servers,
    WorkerGroup,
    lock_key,
    unique,
    worker_group,
)
from tests.support import wait_until


@pytest.fixture(scope="module")
def shared(servers: Servers, celery_app: Any) -> Iterator[WorkerGroup]:
    with worker_group(servers) as group:
        yield group


@pytest.fixture(scope="module")
def two(shared: WorkerGroup) -> list[CeleryWorkerProcess]:
    """Two prefork workers, each on a queue of its own, started side by side."""
    started = [*shared.launch(1, concurrency=2), *shared.launch(1, concurrency=2)]
    for worker in started:
        worker.wait_ready()
    return started


def locks(servers: Servers, *args: str) -> str:
    """``celery locks *args`` on the workers' lock server, in this process; its output (it must
    succeed). The workers are what the tests pin; the command's own process is tested in
    tests/celery/test_cli.py and by ``show`` below."""
    done = cli("--url", servers.lock.url, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def starts(store: redis.Redis, key: str) -> list[float]:
    """When each body of ``key`` started (worker clock, which is the server's here)."""
    return [float(run.split(b"|")[2]) for run in store.lrange(f"runs:{key}", 0, -1)]


@pytest.fixture
def resumed(locker: RedisLocker) -> Iterator[None]:
    """Every task of tests/celery/tasks/pausing.py resumed after the test, through the lock
    server's live rules in this process (the same keys the workers read: lockapp's settings).
    Not through ``celery locks resume``: that command is what the tests pin."""
    yield
    rules = locker.live_rules
    assert rules is not None, "the workers' lock server has live rules (one Redis server)"
    for task in (
        "paused_skip",
        "paused_queue",
        "paused_queue_for",
        "rate_limited_api",
        "paused_by_priority",
        "paused_fair_by_priority",
    ):
        rules.resume(f"tests.celery.tasks.pausing.{task}")


def test_a_paused_skip_task_is_skipped_with_reason_paused(
    servers: Servers, two: list[CeleryWorkerProcess], store: redis.Redis, resumed: None
) -> None:
    key, task = unique("k"), pausing.paused_skip
    locks(servers, "pause", task.name)
    result = task.apply_async((key,), queue=two[0].queue)
    with pytest.raises(DuplicateTaskSkipped, match="paused until resumed"):
        result.get(timeout=30)
    assert starts(store, key) == []


def test_a_paused_queue_task_stays_parked_and_runs_after_resume(
    servers: Servers, two: list[CeleryWorkerProcess], store: redis.Redis, resumed: None
) -> None:
    key, task = unique("k"), pausing.paused_queue
    locks(servers, "pause", task.name)
    results = [task.apply_async((key,), queue=two[0].queue) for _ in range(3)]
    parked = lock_key(task, key) + ":parked"
    wait_until(lambda: store.zcard(parked) == 3, timeout=30)  # every call ended, parked
    assert starts(store, key) == []
    locks(servers, "resume", task.name)
    for result in results:
        result.get(timeout=30)
    assert len(starts(store, key)) == 3  # each once


def test_a_pause_for_some_seconds_ends_by_itself(
    servers: Servers, two: list[CeleryWorkerProcess], store: redis.Redis, resumed: None
) -> None:
    key, task = unique("k"), pausing.paused_queue_for
    before = time.time()
    locks(servers, "pause", task.name, "--for", "3")
    results = [task.apply_async((key,), queue=two[0].queue) for _ in range(2)]
    for result in results:
        result.get(timeout=30)  # no resume: the pause ended by itself
    assert min(starts(store, key)) >= before + 3


def test_pause_for_in_a_body_stops_the_starts_of_every_key_on_another_worker(
    two: list[CeleryWorkerProcess], store: redis.Redis, resumed: None
) -> None:
    told, later = unique("k"), unique("k")
    task = pausing.rate_limited_api
    before = time.time()
    task.apply_async((told, 3.0), queue=two[0].queue).get(timeout=30)  # answered 429
    result = task.apply_async((later,), queue=two[1].queue)
    result.get(timeout=30)
    assert starts(store, later)[0] >= before + 3


def test_show_names_the_live_cap_and_the_pause(servers: Servers, resumed: None) -> None:
    name = "tests.celery.tasks.pausing.paused_queue"
    locks(servers, "limit", name, "1")
    locks(servers, "pause", name, "--for", "60")
    try:
        result = run_cli("--url", servers.lock.url, "show", f"{name}:ab")
        assert "live cap: 1 slot(s)" in result.stdout
        assert "paused: no start for" in result.stdout
    finally:
        locks(servers, "limit", name, "--reset")


def test_parked_calls_run_by_their_messages_priority_the_brokers_way(
    servers: Servers, two: list[CeleryWorkerProcess], store: redis.Redis, resumed: None
) -> None:
    """The tests' broker is Redis: 0 is its highest priority, so lower numbers run first."""
    key, task = unique("k"), pausing.paused_by_priority
    locks(servers, "pause", task.name)
    parked = lock_key(task, key) + ":parked"
    sent = {}
    for priority in (9, 0, 5):  # each parked before the next is sent: arrival order 9, 0, 5
        sent[priority] = task.apply_async((key,), queue=two[0].queue, priority=priority)
        wait_until(lambda: store.zcard(parked) == len(sent), timeout=30)
    locks(servers, "resume", task.name)
    for result in sent.values():
        result.get(timeout=30)
    order = [run.split(b"|")[0].decode() for run in store.lrange(f"runs:{key}", 0, -1)]
    assert order == [sent[0].id, sent[5].id, sent[9].id]


def test_fair_parked_calls_go_round_robin_across_tenants_each_turn_by_priority(
    servers: Servers, two: list[CeleryWorkerProcess], store: redis.Redis, resumed: None
) -> None:
    """Redis broker: 0 first. Tenant a parks priorities 9, 0, 5, then tenant b one call: a's
    turn goes to its 0, then b's turn, then a's 5 and 9."""
    key, task = unique("k"), pausing.paused_fair_by_priority
    locks(servers, "pause", task.name)
    parked = lock_key(task, key, "a") + ":parked"  # one lock per key, whatever the tenant
    sent = []
    for tenant, priority in (("a", 9), ("a", 0), ("a", 5), ("b", 9)):
        sent.append(task.apply_async((key, tenant), queue=two[0].queue, priority=priority))
        wait_until(lambda: store.zcard(parked) == len(sent), timeout=30)
    locks(servers, "resume", task.name)
    for result in sent:
        result.get(timeout=30)
    a9, a0, a5, b9 = (result.id for result in sent)
    order = [run.split(b"|")[0].decode() for run in store.lrange(f"runs:{key}", 0, -1)]
    assert order == [a0, b9, a5, a9]


# -- latest wins (replace, restart) and the reason of a parked call ---------------------------


#: the tasks the tests below pause (and resume after each)
LATEST_TASKS = ("paused_replace", "paused_restart", "paused_queue_log")


@pytest.fixture
def resumed_latest(locker: RedisLocker) -> Iterator[None]:
    """As ``resumed``, for the tasks of the tests below."""
    yield
    rules = locker.live_rules
    assert rules is not None, "the workers' lock server has live rules (one Redis server)"
    for task in LATEST_TASKS:
        rules.resume(f"tests.celery.tasks.pausing.{task}")


def waiting(store: redis.Redis, task: Any, key: str) -> list[bytes]:
    """The task ids waiting behind the lock of ``task``'s call of ``key``."""
    return list(store.zrange(lock_key(task, key) + ":parked", 0, -1))


def test_a_paused_replace_task_starts_nothing_and_runs_the_newest_after_resume(
    servers: Servers, two: list[CeleryWorkerProcess], store: redis.Redis, resumed_latest: None
) -> None:
    key, task = unique("k"), pausing.paused_replace
    locks(servers, "pause", task.name)
    sent = []
    for _ in range(3):  # each waits before the next is sent: the newest displaces it
        sent.append(task.apply_async((key,), queue=two[0].queue))
        wait_until(lambda r=sent[-1]: waiting(store, task, key) == [r.id.encode()], timeout=30)
    wait_until(lambda: sent[0].state == sent[1].state == "REVOKED", timeout=30)
    assert starts(store, key) == []
    locks(servers, "resume", task.name)
    sent[2].get(timeout=30)
    assert [run.split(b"|")[0] for run in store.lrange(f"runs:{key}", 0, -1)] == [
        sent[2].id.encode()
    ]


def test_a_call_handed_the_lock_during_a_pause_waits_for_its_end(
    servers: Servers, two: list[CeleryWorkerProcess], store: redis.Redis, resumed_latest: None
) -> None:
    key, task = unique("k"), pausing.paused_replace
    # runs while the later call parks and the pause command runs (in this process: a round
    # trip), seconds more than that takes on a loaded machine
    first = task.apply_async((key, 5.0), queue=two[0].queue)
    wait_until(lambda: len(starts(store, key)) == 1, timeout=30)
    later = task.apply_async((key,), queue=two[1].queue)
    wait_until(lambda: waiting(store, task, key) == [later.id.encode()], timeout=30)
    locks(servers, "pause", task.name)  # the release hands the lock on while paused
    first.get(timeout=30)
    wait_until(lambda: store.exists(lock_key(task, key)) == 0, timeout=30)  # given up
    assert len(starts(store, key)) == 1 and waiting(store, task, key) == [later.id.encode()]
    locks(servers, "resume", task.name)
    later.get(timeout=30)
    assert len(starts(store, key)) == 2


def test_a_paused_restart_task_starts_nothing_until_resumed(
    servers: Servers, two: list[CeleryWorkerProcess], store: redis.Redis, resumed_latest: None
) -> None:
    key, task = unique("k"), pausing.paused_restart
    running = task.apply_async((key, 30.0), queue=two[0].queue)
    wait_until(lambda: len(starts(store, key)) == 1, timeout=30)
    locks(servers, "pause", task.name)
    newest = task.apply_async((key,), queue=two[1].queue)
    wait_until(lambda: running.state == "REVOKED", timeout=30)  # stopped for the newest
    wait_until(lambda: store.exists(lock_key(task, key)) == 0, timeout=30)
    assert len(starts(store, key)) == 1 and waiting(store, task, key) == [newest.id.encode()]
    locks(servers, "resume", task.name)
    newest.get(timeout=30)
    assert len(starts(store, key)) == 2


def test_a_queue_call_parked_by_a_pause_is_logged_as_paused(
    servers: Servers, two: list[CeleryWorkerProcess], store: redis.Redis, resumed_latest: None
) -> None:
    key, task = unique("k"), pausing.paused_queue_log
    locks(servers, "pause", task.name)
    result = task.apply_async((key,), queue=two[0].queue)
    wait_until(lambda: waiting(store, task, key) == [result.id.encode()], timeout=30)
    line = f"{result.id}]: lock {lock_key(task, key)} paused (celery locks pause, pause_for)"
    wait_until(lambda: line in two[0].log(), timeout=30)
    locks(servers, "resume", task.name)
    result.get(timeout=30)


def test_a_replace_call_waiting_for_a_pause_is_announced_with_the_reason_paused(
    worker: Any, locker: RedisLocker, unique_key: str
) -> None:
    """On the in-process worker (its signal seen here): the lock is free, the pause holds it."""
    seen: list[tuple[str, str]] = []

    def on_duplicate(sender: Any = None, action: str = "", reason: str = "", **_: Any) -> None:
        if getattr(sender, "name", None) == latestapp.newest.name:
            seen.append((action, reason))

    rules = locker.live_rules
    assert rules is not None  # one server
    name = latestapp.newest.lock_options.keyer.name((unique_key, 0), {})
    lock_duplicate.connect(on_duplicate, weak=False)
    rules.pause(latestapp.newest.name, None)
    try:
        held = latestapp.newest.delay(unique_key, "v1")
        wait_until(lambda: seen == [("replace", "paused")], timeout=10)
    finally:
        rules.resume(latestapp.newest.name)
        lock_duplicate.disconnect(on_duplicate)
        # this worker runs no sweeper: take the waiting call out, no other worker's sends it
        locker.queue.drop_parked(name, held.id, reservation_ttl=30)
    assert latestapp.started(unique_key) == []
