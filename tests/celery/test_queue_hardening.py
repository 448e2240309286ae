"""Policy ``queue`` with real ``celery worker`` processes: parked calls that never take
their lock (revoked, expired, unreadable) are dropped and the lock handed on at once, and
re-sent copies of a parked call run once.

Without these, a hand-off to a call the worker discards (a revoke, an ``expires`` that passed
while it was parked) left the lock reserved for it until the reservation ran out
(``singleton_lock_handoff_timeout``), and the sweeper then reserved it for the same call again:
every call parked behind it waited for ever.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import redis

from tests.celery.conftest import lock_gone
from tests.celery.tasks import core, queueing
from tests.celery.workers import CeleryWorkerProcess, Servers, lock_key, unique, worker_group
from tests.support import wait_until

#: seconds a test waits for a parked call: far below the 60 s reservation a stuck hand-off
#: would have to wait for
RUN_TIMEOUT = 30


@pytest.fixture(scope="module")
def prefork(servers: Servers, celery_app: Any) -> Iterator[CeleryWorkerProcess]:
    with worker_group(servers) as group:
        (worker,) = group.start(1, pool="prefork", concurrency=2)
        yield worker


def started_order(store: redis.Redis, key: str) -> list[int]:
    return [int(index) for index in store.lrange(f"order:{key}", 0, -1)]


def parked_list(key: str) -> str:
    return lock_key(queueing.queued_in_order, key, 0) + ":parked"


def park(worker: CeleryWorkerProcess, key: str, index: int, **options: Any) -> Any:
    """Send call ``index`` on ``key`` and wait until it is parked."""
    store = core.store()
    before = store.zcard(parked_list(key))
    result = queueing.queued_in_order.apply_async((key, index, 0.05), queue=worker.queue, **options)
    wait_until(lambda: store.zcard(parked_list(key)) == before + 1, timeout=20)
    return result


def hold(worker: CeleryWorkerProcess, store: redis.Redis, key: str, seconds: float) -> Any:
    holder = queueing.queued_in_order.apply_async((key, 0, seconds), queue=worker.queue)
    wait_until(lambda: started_order(store, key) == [0], timeout=20)
    return holder


def test_a_revoked_parked_call_is_dropped_and_the_next_one_runs(
    prefork: CeleryWorkerProcess, store: redis.Redis, celery_app: Any
) -> None:
    key = unique("k")
    holder = hold(prefork, store, key, 2.0)
    revoked, second, third = (park(prefork, key, index) for index in (1, 2, 3))
    replies = celery_app.control.revoke(revoked.id, reply=True, timeout=5)
    assert replies, "the worker did not answer the revoke"
    assert holder.get(timeout=RUN_TIMEOUT) == 0
    assert [second.get(timeout=RUN_TIMEOUT), third.get(timeout=RUN_TIMEOUT)] == [2, 3]
    assert revoked.state == "REVOKED"
    assert started_order(store, key) == [0, 2, 3]
    assert store.zcard(parked_list(key)) == 0
    assert int(store.get(f"overlaps:{key}") or 0) == 0


def test_a_parked_call_that_expired_meanwhile_is_dropped_and_the_next_one_runs(
    prefork: CeleryWorkerProcess, store: redis.Redis
) -> None:
    key = unique("k")
    holder = hold(prefork, store, key, 3.0)
    expiring = park(prefork, key, 1, expires=1.0)  # its expiry passes while it is parked
    second = park(prefork, key, 2)
    assert holder.get(timeout=RUN_TIMEOUT) == 0
    assert second.get(timeout=RUN_TIMEOUT) == 2
    assert expiring.state == "REVOKED"
    assert started_order(store, key) == [0, 2]
    assert store.zcard(parked_list(key)) == 0
    lock = lock_key(queueing.queued_in_order, key, 0)
    wait_until(lambda: lock_gone(store, lock), timeout=10)
