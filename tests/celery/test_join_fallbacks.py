"""``on_duplicate="join"`` past ``lock_wait_timeout``: the lock retry that joins again, on the
session's in-process worker (threads, 4 slots)."""

from __future__ import annotations

from typing import Any

import redis

from celery_singleton_lock.celery import lock_duplicate
from celery_singleton_lock.celery.duplicates.join import JOIN_HEADER
from celery_singleton_lock.celery.duplicates.redelivery import RETRY_HEADER
from tests.celery.tasks import join
from tests.support import wait_until


def body_runs(store: redis.Redis, key: str) -> int:
    return int(store.llen(f"runs:{key}"))


def test_joiner_waiting_past_its_timeout_lock_retries_and_still_gets_the_holders_result(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    joins: list[str] = []

    def record(task_id: str, action: str, **_: Any) -> None:
        if action == "join":
            joins.append(task_id)

    lock_duplicate.connect(record, weak=False)
    try:
        holder = join.join_value.delay(unique_key, 3.0)  # lock_wait_timeout=1
        wait_until(lambda: body_runs(store, unique_key) == 1, timeout=15)
        duplicate = join.join_value.delay(unique_key, 3.0)
        assert duplicate.get(timeout=30) == holder.get(timeout=30)
    finally:
        lock_duplicate.disconnect(record)
    assert joins.count(duplicate.id) >= 2  # joined, timed out, lock-retried, joined again
    assert body_runs(store, unique_key) == 1


def test_lock_retry_arriving_after_its_holder_ended_takes_the_stored_outcome(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    holder = join.join_value.delay(unique_key, 0.0)
    value = holder.get(timeout=15)
    retried = join.join_value.apply_async(
        (unique_key, 0.0), headers={JOIN_HEADER: holder.id, RETRY_HEADER: 1}
    )
    assert retried.get(timeout=15) == value
    assert retried.state == "SUCCESS"
    assert body_runs(store, unique_key) == 1


def test_lock_retry_whose_holder_left_no_outcome_runs_the_body(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    retried = join.join_value.apply_async(
        (unique_key, 0.0), headers={JOIN_HEADER: "a-holder-killed-before-its-outcome"}
    )
    assert retried.get(timeout=15)["key"] == unique_key
    assert body_runs(store, unique_key) == 1
