"""``celery_singleton_lock.testing.hold_lock``: a run in progress, played by a test.

Against the session's real lock server and in-process worker (tests/celery/conftest.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from celery_singleton_lock import (
    DuplicateTaskError,
    DuplicateTaskSkipped,
    LockConfigurationError,
    LockLostError,
)
from celery_singleton_lock.celery import lock_duplicate
from celery_singleton_lock.engine import AcquireRequest, Lease, Owner, RedisLocker
from celery_singleton_lock.testing import HOLD_LOCK_TASK_ID, hold_lock
from tests.celery.conftest import lock_key_of
from tests.celery.tasks import limits, policies
from tests.support import wait_until


def test_hold_lock_holds_the_lock_that_call_would_take(
    celery_app: Any, store: redis.Redis, unique_key: str
) -> None:
    with hold_lock(policies.hold_skip, unique_key) as lease:
        assert lease.key == lock_key_of(policies.hold_skip, unique_key)
        assert store.exists(lease.key)


def test_hold_lock_holds_under_task_id_hold_lock(
    celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    name = policies.hold_skip.lock_options.keyer.name((unique_key,), {})
    with hold_lock(policies.hold_skip, unique_key):
        holder = locker.inspect.read(name)
    assert holder is not None
    assert holder.task_id == HOLD_LOCK_TASK_ID == "hold_lock"


def test_hold_lock_releases_its_lock_when_the_block_ends(
    celery_app: Any, store: redis.Redis, unique_key: str
) -> None:
    with hold_lock(policies.hold_skip, unique_key) as lease:
        pass
    assert not store.exists(lease.key)


def test_hold_lock_releases_its_lock_when_the_block_raises(
    celery_app: Any, store: redis.Redis, unique_key: str
) -> None:
    with pytest.raises(ZeroDivisionError), hold_lock(policies.hold_skip, unique_key) as lease:
        1 / 0  # noqa: B018
    assert not store.exists(lease.key)


def test_hold_lock_renews_its_lock_only_while_held(
    celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    with hold_lock(policies.hold_skip, unique_key) as lease:
        assert lease in locker.renewer.leases()
    assert lease not in locker.renewer.leases()


def test_a_worker_run_under_hold_lock_is_skipped_naming_hold_lock(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    with hold_lock(policies.hold_skip, unique_key), pytest.raises(DuplicateTaskSkipped) as skipped:
        policies.hold_skip.delay(unique_key).get(timeout=10)
    assert skipped.value.holder is not None
    assert skipped.value.holder["task_id"] == "hold_lock"
    assert store.llen(f"runs:{unique_key}") == 0


def test_apply_under_hold_lock_fails_with_the_fail_policy(
    celery_app: Any, store: redis.Redis, unique_key: str
) -> None:
    with hold_lock(policies.hold_fail, unique_key):
        result = policies.hold_fail.apply(args=(unique_key,))
    assert isinstance(result.result, DuplicateTaskError)
    assert store.llen(f"runs:{unique_key}") == 0


def test_a_waiting_duplicate_runs_once_hold_lock_ends(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    waiting: list[str] = []

    def record(task_id: str, action: str, **_: Any) -> None:
        if action == "wait":
            waiting.append(task_id)

    lock_duplicate.connect(record, weak=False)
    try:
        with hold_lock(policies.hold_wait, unique_key):
            result = policies.hold_wait.delay(unique_key)
            wait_until(lambda: result.id in waiting)
            assert store.llen(f"runs:{unique_key}") == 0
    finally:
        lock_duplicate.disconnect(record)
    assert result.get(timeout=15)["key"] == unique_key
    assert store.llen(f"runs:{unique_key}") == 1


def test_no_call_of_a_lock_limit_task_runs_under_hold_lock(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    # lock_limit=3: hold_lock holds all 3 slots, as 3 runs in progress would
    with hold_lock(limits.limit3_skip, unique_key):
        for _ in range(3):
            with pytest.raises(DuplicateTaskSkipped) as skipped:
                limits.limit3_skip.delay(unique_key).get(timeout=10)
            assert skipped.value.holder is not None
            assert skipped.value.holder["task_id"] == "hold_lock"
    assert store.llen(f"runs:{unique_key}") == 0
    assert limits.limit3_skip.delay(unique_key).get(timeout=10)["slot"] == 1  # all released


def test_hold_lock_holds_the_slots_a_callable_lock_limit_gives_that_call(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    key = f"big-{unique_key}"  # the tenant's limit is 2
    with hold_lock(limits.limit_per_tenant, key), pytest.raises(DuplicateTaskSkipped):
        limits.limit_per_tenant.delay(key).get(timeout=10)
    assert store.llen(f"runs:{key}") == 0


def test_hold_lock_of_a_limited_lock_holds_nothing_when_a_slot_is_taken(
    celery_app: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    name = limits.limit3_skip.lock_options.keyer.name((unique_key,), {})
    running = locker.acquire(AcquireRequest(name, 30, owner=Owner(task_id="running"), limit=3))
    assert isinstance(running, Lease)
    try:
        with pytest.raises(DuplicateTaskError), hold_lock(limits.limit3_skip, unique_key):
            pytest.fail("the block ran without the lock")
        # the 2 slots it took before it found the third held are free again
        assert [held.task_id for held in locker.inspect.holders(name, 3)] == ["running"]
    finally:
        running.release()


def test_hold_lock_refuses_a_lock_someone_else_holds(
    celery_app: Any, store: redis.Redis, unique_key: str
) -> None:
    with hold_lock(policies.hold_skip, unique_key) as first:
        value = store.get(first.key)
        expected = pytest.raises(DuplicateTaskError, match="already held by task id 'hold_lock'")
        with expected as refused, hold_lock(policies.hold_skip, unique_key):
            pytest.fail("the block ran without the lock")
        assert refused.value.key == first.key
        assert store.get(first.key) == value  # the first hold is untouched


def test_hold_lock_reports_a_lock_lost_while_the_block_ran(
    celery_app: Any, store: redis.Redis, unique_key: str
) -> None:
    lost = pytest.raises(LockLostError, match="was lost while the block ran")
    with lost, hold_lock(policies.hold_skip, unique_key) as lease:
        store.delete(lease.key)


def test_hold_lock_needs_a_locked_task(celery_app: Any) -> None:
    not_locked = celery_app.tasks["celery.backend_cleanup"]
    refused = pytest.raises(LockConfigurationError, match="is not a LockedTask")
    with refused, hold_lock(not_locked):
        pytest.fail("a task without a lock has nothing to hold")
