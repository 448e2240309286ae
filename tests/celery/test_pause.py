"""``celery locks pause`` / ``resume`` and ``self.request.lock.pause_for`` on real ``celery
worker`` processes and a real Redis: while a task's (or group's) name is paused no body of it
starts, and each call follows its ``on_duplicate`` policy. Each test pauses a task of its own
(tests/celery/tasks/pausing.py): a pause stops every call of its task."""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest
import redis

from celery_singleton_lock import DuplicateTaskSkipped
from celery_singleton_lock.engine import RedisLocker
from tests.celery.tasks import pausing
from tests.celery.test_cli import run_cli
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
    """``celery locks *args`` on the workers' lock server; its output (it must succeed)."""
    done = run_cli("--url", servers.lock.url, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def starts(store: redis.Redis, key: str) -> list[float]:
    """When each body of ``key`` started (worker clock, which is the server's here)."""
    return [float(run.split(b"|")[2]) for run in store.lrange(f"runs:{key}", 0, -1)]


@pytest.fixture
def resumed(locker: RedisLocker) -> Iterator[None]:
    """Every task of tests/celery/tasks/pausing.py resumed after the test, through the lock
    server's live rules in this process (the same keys the workers read: lockapp's settings).
    Not through ``celery locks resume``: that command is what the tests pin, and five ``celery``
    processes here cost about 20 s a test on 2 loaded cores."""
    yield
    rules = locker.live_rules
    assert rules is not None, "the workers' lock server has live rules (one Redis server)"
    for task in (
        "paused_skip",
        "paused_queue",
        "paused_queue_for",
        "rate_limited_api",
        "paused_by_priority",
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
