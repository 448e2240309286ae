from __future__ import annotations

from typing import Any

import redis

from tests.celery import lockapp
from tests.celery.conftest import lock_key_of


def test_a_locked_task_runs_and_leaves_no_lock(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    result = lockapp.hold_skip.delay(unique_key, 0.01)
    assert result.get(timeout=10)["key"] == unique_key
    assert not store.exists(lock_key_of(lockapp.hold_skip, unique_key))
