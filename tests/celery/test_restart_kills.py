"""``kill -9`` while a restart is in progress (``on_duplicate="restart"``), with real prefork
workers: of the old call's pool child, and of the whole worker that received the new call. The
newest call still runs exactly once, and never beside the old one."""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import Any, Iterator

import pytest

from celery_singleton_lock.celery.config.lockers import locker_for
from tests.celery.tasks import restart
from tests.celery.tasks.core import store
from tests.celery.test_restart_workers import (
    assert_superseded_then_alone,
    listed,
    overlaps,
    waiting,
)
from tests.celery.workers import CeleryWorkerProcess, Servers, unique, worker_group
from tests.support import wait_until


@pytest.fixture(scope="module")
def servers(servers: Servers) -> Servers:
    # a short visibility timeout: a killed worker's reserved messages come back within 2 s
    return dataclasses.replace(servers, visibility_timeout=2)


@pytest.fixture
def pair(servers: Servers, celery_app: Any) -> Iterator[list[CeleryWorkerProcess]]:
    """Two prefork workers on one queue."""
    with worker_group(servers) as group:
        yield group.start(2, queue=unique("q"), pool="prefork", concurrency=2)


def new_call_waits(task: Any, key: str, queue: str) -> tuple[Any, Any]:
    """v1 running, then v2 sent, parked behind it, and v1 asked to stop (the restart under
    way)."""
    v1 = task.apply_async((key,), queue=queue)
    wait_until(lambda: listed("started", key) == [v1.id], timeout=30)
    v2 = task.apply_async((key, 0.5), queue=queue)
    wait_until(lambda: waiting(task, key) == v2.id, timeout=10)
    wait_until(lambda: asked_to_stop(task, key, v1.id), timeout=10)  # its second round trip
    return v1, v2


def asked_to_stop(task: Any, key: str, task_id: str) -> bool:
    cancels = locker_for(task.app).cancels
    assert cancels is not None
    return cancels.cancel_requested([(task.lock_options.keyer.name((key,), {}), task_id)])[0]


def test_the_old_calls_child_killed_during_the_grace_lets_the_new_call_run_once(
    pair: list[CeleryWorkerProcess],
) -> None:
    key = unique("k")
    v1, v2 = new_call_waits(restart.stubborn, key, pair[0].queue)
    v1_pid = int(store().lindex(f"started:{key}", 0).decode().rsplit("|", 1)[1])
    os.kill(v1_pid, signal.SIGKILL)  # before its 1 s grace ends
    assert v2.get(timeout=30) == v2.id
    assert listed("started", key) == [v1.id, v2.id]
    assert listed("ended", key) == [v2.id]
    assert overlaps(key) == 0


def test_the_new_calls_worker_killed_after_it_parked_the_call_lets_it_run_once(
    pair: list[CeleryWorkerProcess],
) -> None:
    key = unique("k")
    v1, v2 = new_call_waits(restart.short_ttl, key, pair[0].queue)
    (receiver,) = [worker for worker in pair if v2.id in worker.log()]
    receiver.crash()  # kill -9 of its whole process group (v1 too, if it ran there)
    (survivor,) = [worker for worker in pair if worker is not receiver]
    assert v2.get(timeout=45) == v2.id
    if v1.id in survivor.log():  # v1 ran on the survivor: stopped there after its grace
        assert_superseded_then_alone(key, v1, v2)
    assert listed("started", key) == [v1.id, v2.id]  # v2 ran once
    assert overlaps(key) == 0
