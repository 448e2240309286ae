"""``lock_limit`` with real ``celery worker`` processes (prefork): a killed holder's slot is
freed (by its TTL, or by the worker's main process), and the other holders keep theirs."""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Iterator

import pytest
import redis
from celery import Celery
from celery.exceptions import WorkerLostError

from celery_singleton_lock import DuplicateTaskSkipped
from celery_singleton_lock.engine import LockHolder, RedisLocker
from tests.celery.tasks import limits
from tests.celery.workers import Servers, WorkerGroup, unique, worker_group
from tests.support import wait_until

#: seconds the main process may take to free a dead child's slot once Celery reported it
RECLAIM_WITHIN = 3.0


@pytest.fixture
def workers(servers: Servers, celery_app: Any) -> Iterator[WorkerGroup]:
    """``celery worker`` processes on the session's servers (``celery_app`` configures them)."""
    with worker_group(servers) as group:
        yield group


def slots_held(store: redis.Redis, task: Any, key: str) -> list[LockHolder]:
    options = task.lock_options
    name = options.keyer.name((key,), {})
    return RedisLocker(store, prefix=options.prefix).inspect.holders(name, 3)


def send(client: Celery, queue: str, task: Any, *args: Any) -> Any:
    return client.send_task(task.name, args=args, queue=queue)


def test_kill_9_of_a_worker_holding_one_of_3_slots_frees_it_within_ttl_others_keep_theirs(
    workers: WorkerGroup, celery_app: Celery, store: redis.Redis
) -> None:
    key, task = unique("k"), limits.limit3_short_ttl  # lock_ttl=2
    (doomed,) = workers.launch(1, pool="prefork", concurrency=1)
    (keeper,) = workers.launch(1, pool="prefork", concurrency=2)
    workers.wait_ready()
    doomed_call = send(celery_app, doomed.queue, task, key, 30)
    wait_until(lambda: len(slots_held(store, task, key)) == 1, timeout=20)
    kept = [send(celery_app, keeper.queue, task, key, 6) for _ in range(2)]
    wait_until(lambda: len(slots_held(store, task, key)) == 3, timeout=20)
    (doomed_slot,) = (h for h in slots_held(store, task, key) if h.task_id == doomed_call.id)
    doomed.kill_group(signal.SIGKILL)
    killed_at = time.monotonic()
    wait_until(
        lambda: doomed_slot.key not in {h.key for h in slots_held(store, task, key)},
        timeout=2.0 + 1.0,
        interval=0.01,
    )
    print(f"slot {doomed_slot.key} gone {time.monotonic() - killed_at:.2f}s after the kill")
    assert [result.get(timeout=30)["lost"] for result in kept] == [False, False]


def test_sigkill_of_a_pool_child_holding_slot_2_is_freed_by_the_main_process(
    workers: WorkerGroup, celery_app: Celery, store: redis.Redis
) -> None:
    key, task = unique("k"), limits.limit3_long_ttl  # lock_ttl=30
    (worker,) = workers.start(1, pool="prefork", concurrency=2)
    # 10 s bodies: long enough to outlast the kill and the reclaim (the first one is not
    # waited for: the worker is killed at the end, nothing is asserted of it)
    send(celery_app, worker.queue, task, key, 10)
    wait_until(lambda: len(slots_held(store, task, key)) == 1, timeout=20)
    second = send(celery_app, worker.queue, task, key, 10)
    wait_until(lambda: len(slots_held(store, task, key)) == 2, timeout=20)
    (holder,) = (h for h in slots_held(store, task, key) if h.task_id == second.id)
    assert holder.key.endswith(":slot:2") and holder.pid in worker.children()
    os.kill(holder.pid, signal.SIGKILL)
    with pytest.raises(WorkerLostError):
        second.get(timeout=15)
    wait_until(
        lambda: holder.key not in {h.key for h in slots_held(store, task, key)},
        timeout=RECLAIM_WITHIN,
        interval=0.01,
    )
    assert len(slots_held(store, task, key)) == 1  # the other holder keeps its slot
    worker.crash()  # a warm stop would wait out the first body (~8 s more) for nothing


def test_limit_3_with_skip_on_a_prefork_worker_runs_exactly_3_of_6_calls_sent_at_once(
    workers: WorkerGroup, celery_app: Celery, store: redis.Redis
) -> None:
    key, task = unique("k"), limits.limit3_skip
    (worker,) = workers.start(1, pool="prefork", concurrency=4)
    results = [send(celery_app, worker.queue, task, key, 1.5) for _ in range(6)]
    ran = 0
    for result in results:
        try:
            result.get(timeout=60)
            ran += 1
        except DuplicateTaskSkipped:
            pass
    assert (ran, store.llen(f"runs:{key}")) == (3, 3)
