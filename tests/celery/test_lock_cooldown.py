"""``lock_cooldown``: after a body ends its key stays taken for a while, on a real worker
(threads pool, in this process so the lock signals reach the test)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from celery_singleton_lock import DuplicateTaskSkipped, LockConfigurationError
from tests.celery.registration import register
from tests.celery.tasks import limits
from tests.celery.test_lock_rate import CLOCKS, starts
from tests.support import wait_until


def runs(store: redis.Redis, key: str) -> int:
    return int(store.llen(f"runs:{key}"))


def test_a_call_1s_after_the_end_of_a_run_inside_a_3s_cooldown_is_skipped(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    limits.cooldown3_skip.delay(unique_key).get(timeout=30)
    time.sleep(1.0)
    with pytest.raises(DuplicateTaskSkipped):
        limits.cooldown3_skip.delay(unique_key).get(timeout=30)
    assert runs(store, unique_key) == 1


def test_a_call_3_5s_after_the_end_of_a_run_past_a_3s_cooldown_runs(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    limits.cooldown3_skip.delay(unique_key).get(timeout=30)
    time.sleep(3.5)
    limits.cooldown3_skip.delay(unique_key).get(timeout=30)
    assert runs(store, unique_key) == 2


def test_a_duplicate_inside_the_cooldown_says_the_reason_is_the_cooldown(
    worker: Any, unique_key: str, duplicates_seen: list[dict[str, Any]]
) -> None:
    limits.cooldown3_skip.delay(unique_key).get(timeout=30)
    with pytest.raises(DuplicateTaskSkipped):
        limits.cooldown3_skip.delay(unique_key).get(timeout=30)
    assert [seen["reason"] for seen in duplicates_seen] == ["cooldown"]


def test_a_failed_run_leaves_no_cooldown_with_cooldown_after_success(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    task = limits.cooldown_fails_after_success
    for _ in range(2):
        with pytest.raises(ValueError):
            task.delay(unique_key).get(timeout=30)
    assert runs(store, unique_key) == 2


def test_a_failed_run_leaves_a_cooldown_with_cooldown_after_always(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    task = limits.cooldown_fails_after_always
    with pytest.raises(ValueError):
        task.delay(unique_key).get(timeout=30)
    with pytest.raises(DuplicateTaskSkipped):
        task.delay(unique_key).get(timeout=30)
    assert runs(store, unique_key) == 1


def test_a_retry_inside_the_cooldown_is_sent_once_for_its_end_and_runs(
    worker: Any, store: redis.Redis, unique_key: str, duplicates_seen: list[dict[str, Any]]
) -> None:
    limits.cooldown2_retry.delay(unique_key).get(timeout=30)
    limits.cooldown2_retry.delay(unique_key).get(timeout=30)
    assert runs(store, unique_key) == 2
    assert [seen["action"] for seen in duplicates_seen] == ["retry"]


def test_a_wait_inside_the_cooldown_starts_at_its_end_not_at_the_holders_ttl(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    # issue 30 item 3: the release into the cooldown published nothing, so the waiter slept
    # until the TTL it had read of the running holder (15 s) and started ~14 s after the run
    first = limits.cooldown2_wait.delay(unique_key, 1.0)
    wait_until(lambda: runs(store, unique_key) == 1, timeout=10)
    waiter = limits.cooldown2_wait.delay(unique_key)
    first.get(timeout=30)
    waiter.get(timeout=40)
    first_start, waiter_start = starts(store, unique_key)
    late = waiter_start - (first_start + 1.0)  # after the run's end
    print(f"wait with lock_cooldown=2: started {late:.2f}s after the run ended")
    assert 2.0 - CLOCKS <= late <= 3.5


@pytest.mark.parametrize("bad", [-1, "3", True, 10**9])
def test_a_cooldown_that_is_no_number_of_seconds_is_refused(
    registration_app: Any, bad: Any
) -> None:
    with pytest.raises(
        LockConfigurationError,
        match=r"billing\.job: lock_cooldown( must be None or a number|=.* is out of range)",
    ):
        register(registration_app, lock_cooldown=bad)


def test_an_unknown_cooldown_after_is_refused(registration_app: Any) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job: lock_cooldown_after='x'"):
        register(registration_app, lock_cooldown=1, lock_cooldown_after="x")


@pytest.mark.parametrize("policy", ["join", "replace"])
def test_a_cooldown_with_a_policy_waiting_for_a_release_is_refused(
    registration_app: Any, policy: str
) -> None:
    with pytest.raises(LockConfigurationError, match=rf"lock_cooldown=1 .*'{policy}'"):
        register(registration_app, lock_cooldown=1, on_duplicate=policy)


def test_a_cooldown_is_refused_on_a_quorum(registration_app: Any) -> None:
    registration_app.conf.singleton_lock_url = [f"redis://127.0.0.1:{port}/0" for port in (1, 2, 3)]
    with pytest.raises(LockConfigurationError, match=r"lock_cooldown=1.*Redlock quorum"):
        register(registration_app, lock_cooldown=1)


def test_a_skip_inside_the_cooldown_names_the_cooldown_and_the_run_that_ended(
    worker: Any, unique_key: str
) -> None:
    first = limits.cooldown3_skip.delay(unique_key)
    first.get(timeout=30)
    with pytest.raises(DuplicateTaskSkipped) as skipped:
        limits.cooldown3_skip.delay(unique_key).get(timeout=30)
    assert f"is in its lock_cooldown after the run of task {first.id} " in str(skipped.value)
