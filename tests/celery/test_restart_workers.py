"""``on_duplicate="restart"`` on a real prefork ``celery worker``: the newest call stops the
running call of its key and runs in its place, never beside it; cooperatively (the body reads
``self.request.lock.cancelled``) or, past ``lock_cancel_grace``, by the worker terminating the
pool child."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import pytest
from celery.exceptions import TaskRevokedError

from celery_singleton_lock.celery.config.lockers import locker_for
from tests.celery.tasks import restart
from tests.celery.tasks.core import store
from tests.celery.workers import CeleryWorkerProcess, Servers, unique, worker_group
from tests.support import wait_until


@pytest.fixture(scope="module")
def workers(servers: Servers, celery_app: Any) -> Iterator[dict[str, CeleryWorkerProcess]]:
    """A prefork and a threads worker, started side by side, each on a queue of its own."""
    with worker_group(servers) as group:
        launched = {pool: group.launch(1, pool=pool, concurrency=2)[0] for pool in POOLS}
        group.wait_ready()
        yield launched


POOLS = ("prefork", "threads")


@dataclass
class HourlyReads(Servers):
    """Workers whose restartable bodies read their cancel flag once an hour (the fallback):
    a stop reaches them pushed, or not before their end."""

    def env(self, queue: str, **extra: str) -> dict[str, str]:
        return super().env(queue, CSL_CANCEL_POLL="3600", **extra)


@pytest.fixture(scope="module")
def hourly_reads(servers: Servers, celery_app: Any) -> Iterator[CeleryWorkerProcess]:
    hourly = HourlyReads(servers.broker_url, servers.lock, servers.backend_url)
    with worker_group(hourly) as group:
        yield group.start(1, pool="threads", concurrency=2)[0]


@pytest.fixture
def prefork(workers: dict[str, CeleryWorkerProcess]) -> CeleryWorkerProcess:
    return workers["prefork"]


def listed(what: str, key: str) -> list[str]:
    return [entry.decode().split("|")[0] for entry in store().lrange(f"{what}:{key}", 0, -1)]


def waiting(task: Any, key: str) -> Optional[str]:
    """The task id of the call waiting as the newest behind ``task``'s lock of ``key``."""
    newest = locker_for(task.app).inspect.waiting_newest(task.lock_options.keyer.name((key,), {}))
    return None if newest is None else newest[0]


def overlaps(key: str) -> int:
    return int(store().get(f"overlaps:{key}") or 0)


def restart_after_a_second(
    task: Any, key: str, queue: str, seconds: float
) -> tuple[Any, Any, float]:
    """v1, then v2 (a body of ``seconds``) sent 1 s after v1's body started: both results and
    how long after its send v2's body ran to its end."""
    v1 = task.apply_async((key,), queue=queue)
    wait_until(lambda: listed("started", key) == [v1.id], timeout=30)
    time.sleep(1)
    sent = time.monotonic()
    v2 = task.apply_async((key, seconds), queue=queue)
    assert v2.get(timeout=30) == v2.id
    took = time.monotonic() - sent
    print(f"\n{task.name}: v2 ran to its {seconds:g} s end {took:.2f}s after it was sent")
    return v1, v2, took


def assert_superseded_then_alone(key: str, v1: Any, v2: Any) -> None:
    """v1 ended REVOKED ("superseded") without running to its end; v2 started after it and
    ran to its end; never two bodies at once."""
    with pytest.raises(TaskRevokedError, match="superseded"):
        v1.get(timeout=10)
    assert listed("started", key) == [v1.id, v2.id]
    assert listed("ended", key) == [v2.id]
    assert overlaps(key) == 0


@pytest.mark.parametrize("pool", POOLS)
def test_a_newer_call_stops_the_running_one_which_ends_superseded_before_it_starts(
    workers: dict[str, CeleryWorkerProcess], pool: str
) -> None:
    key = unique("k")
    v1, v2, took = restart_after_a_second(restart.cooperative, key, workers[pool].queue, 1.0)
    assert_superseded_then_alone(key, v1, v2)
    assert listed("stopped", key) == [v1.id]  # it saw lock.cancelled
    assert took < 15  # v1 ran on to its 20 s end otherwise


def test_a_body_whose_own_reads_are_an_hour_apart_is_told_to_stop_by_the_push(
    hourly_reads: CeleryWorkerProcess,
) -> None:
    key = unique("k")
    v1, v2, took = restart_after_a_second(restart.cooperative, key, hourly_reads.queue, 0.5)
    assert_superseded_then_alone(key, v1, v2)
    assert listed("stopped", key) == [v1.id]  # it saw lock.cancelled, pushed: no read since
    assert took < 15  # v1 ran on to its 20 s end otherwise


def test_a_call_that_ignores_the_stop_has_its_child_terminated_after_the_grace(
    prefork: CeleryWorkerProcess,
) -> None:
    key = unique("k")
    v1, v2, took = restart_after_a_second(restart.stubborn, key, prefork.queue, 0.5)
    assert took < 20  # v1's 30 s body ended otherwise
    v1_pid = int(store().lindex(f"started:{key}", 0).decode().rsplit("|", 1)[1])
    wait_until(lambda: v1_pid not in prefork.children(), timeout=10)  # terminated, replaced
    assert_superseded_then_alone(key, v1, v2)


def test_a_third_call_takes_the_place_of_the_second_while_the_first_is_stopping(
    prefork: CeleryWorkerProcess,
) -> None:
    key = unique("k")
    v1 = restart.stubborn.apply_async((key,), queue=prefork.queue)
    wait_until(lambda: listed("started", key) == [v1.id], timeout=30)
    v2 = restart.stubborn.apply_async((key, 0.5), queue=prefork.queue)
    wait_until(lambda: waiting(restart.stubborn, key) == v2.id, timeout=10)
    v3 = restart.stubborn.apply_async((key, 0.5), queue=prefork.queue)
    assert v3.get(timeout=30) == v3.id
    with pytest.raises(TaskRevokedError, match="superseded"):
        v2.get(timeout=10)
    assert listed("started", key) == [v1.id, v3.id]  # v2 never ran
    assert_superseded_then_alone(key, v1, v3)


def test_a_threads_worker_says_a_cancel_grace_has_no_effect_there(
    workers: dict[str, CeleryWorkerProcess],
) -> None:
    warning = "task tests.celery.tasks.restart.stubborn: lock_cancel_grace has no effect"
    assert warning in workers["threads"].log()
    assert warning not in workers["prefork"].log()
