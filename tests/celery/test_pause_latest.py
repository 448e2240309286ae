"""A pause (``celery locks pause``) of a task whose newest call wins (``replace``,
``restart``) on real prefork ``celery worker`` processes and a real Redis: no body of it starts
while paused, and the newest call is the one that runs once it is resumed; a call parked by a
pause says so (reason "paused"). Each test pauses a task of its own
(tests/celery/tasks/pausing.py)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import redis

from celery_singleton_lock.celery import lock_duplicate
from celery_singleton_lock.engine import RedisLocker
from tests.celery import latestapp
from tests.celery.tasks import pausing
from tests.celery.test_pause import locks, starts
from tests.celery.workers import (
    CeleryWorkerProcess,
    Servers,
    WorkerGroup,
    lock_key,
    unique,
    worker_group,
)
from tests.support import wait_until

TASKS = ("paused_replace", "paused_restart", "paused_queue_log")


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


@pytest.fixture
def resumed(servers: Servers) -> Iterator[None]:
    yield
    for task in TASKS:
        locks(servers, "resume", f"tests.celery.tasks.pausing.{task}")


def waiting(store: redis.Redis, task: Any, key: str) -> list[bytes]:
    """The task ids waiting behind the lock of ``task``'s call of ``key``."""
    return list(store.zrange(lock_key(task, key) + ":parked", 0, -1))


def test_a_paused_replace_task_starts_nothing_and_runs_the_newest_after_resume(
    servers: Servers, two: list[CeleryWorkerProcess], store: redis.Redis, resumed: None
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
    servers: Servers, two: list[CeleryWorkerProcess], store: redis.Redis, resumed: None
) -> None:
    key, task = unique("k"), pausing.paused_replace
    first = task.apply_async((key, 2.0), queue=two[0].queue)
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
    servers: Servers, two: list[CeleryWorkerProcess], store: redis.Redis, resumed: None
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
    servers: Servers, two: list[CeleryWorkerProcess], store: redis.Redis, resumed: None
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
