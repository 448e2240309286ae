"""``lock_limit``: at most N bodies per lock key at once, on a real worker (threads pool, 4
slots, in this process so the lock signals reach the test)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from celery_singleton_lock import DuplicateTaskSkipped, LockConfigurationError
from tests.celery.tasks.limits import limit2_wait, limit3_retry, limit3_skip, limit_per_tenant


def outcomes(results: list[Any], timeout: float = 60) -> list[Any]:
    done = []
    for result in results:
        try:
            done.append(result.get(timeout=timeout))
        except DuplicateTaskSkipped as exc:
            done.append(exc)
    return done


def test_limit_3_with_skip_runs_exactly_3_of_6_calls_sent_at_once(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    done = outcomes([limit3_skip.delay(unique_key, 1.5) for _ in range(6)])
    assert sum(isinstance(outcome, dict) for outcome in done) == 3
    assert store.llen(f"runs:{unique_key}") == 3


def test_limit_3_holders_each_hold_a_different_slot(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    done = outcomes([limit3_skip.delay(unique_key, 1.5) for _ in range(3)])
    assert sorted(outcome["slot"] for outcome in done) == [1, 2, 3]


def test_limit_3_with_retry_runs_each_of_12_calls_exactly_once(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    results = [limit3_retry.delay(unique_key, 0.5) for _ in range(12)]
    outcomes(results, timeout=120)
    ran = [entry.split(b"|")[0].decode() for entry in store.lrange(f"runs:{unique_key}", 0, -1)]
    assert sorted(ran) == sorted(result.id for result in results)


def test_limit_3_never_has_more_than_3_bodies_inside_and_reaches_3(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    outcomes([limit3_retry.delay(unique_key, 0.5) for _ in range(12)], timeout=120)
    assert int(store.get(f"most:{unique_key}") or 0) == 3


def test_limit_fences_strictly_increase_across_slots(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    done = outcomes([limit3_retry.delay(unique_key, 0.3) for _ in range(6)], timeout=120)
    fences = [outcome["fence"] for outcome in done]
    assert len(set(fences)) == 6 and all(fence >= 1 for fence in fences)


def test_limit_duplicate_says_the_reason_is_the_limit(
    worker: Any, unique_key: str, duplicates_seen: list[dict[str, Any]]
) -> None:
    outcomes([limit3_skip.delay(unique_key, 1.5) for _ in range(4)])
    assert [seen["reason"] for seen in duplicates_seen] == ["limit"]


def test_limit_2_with_wait_runs_all_4_calls(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    outcomes([limit2_wait.delay(unique_key, 0.5) for _ in range(4)])
    assert store.llen(f"runs:{unique_key}") == 4
    assert int(store.get(f"most:{unique_key}") or 0) <= 2


def test_a_callable_limit_caps_each_key_by_its_own_value(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    big, small = f"big-{unique_key}", f"small-{unique_key}"
    done = outcomes([limit_per_tenant.delay(key, 1.5) for key in (big,) * 3 + (small,) * 3])
    assert [isinstance(outcome, dict) for outcome in done].count(True) == 3
    assert (store.llen(f"runs:{big}"), store.llen(f"runs:{small}")) == (2, 1)


def test_a_callable_limit_returning_0_fails_the_call_naming_task_and_option(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    with pytest.raises(LockConfigurationError) as info:
        limit_per_tenant.delay(f"zero-{unique_key}").get(timeout=30)
    assert "limit_per_tenant" in str(info.value) and "lock_limit" in str(info.value)
    assert store.llen(f"runs:zero-{unique_key}") == 0
