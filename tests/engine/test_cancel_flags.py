"""The cancel flags of policy ``restart``: CANCEL_HOLDER flags the running holder's task id,
and the reads say which calls were asked to stop."""

from __future__ import annotations

import pytest
import redis

from celery_singleton_lock.engine import Lease, Owner, RedisLocker
from celery_singleton_lock.engine.kinds.cancels import Cancels


@pytest.fixture
def flags(locker: RedisLocker) -> Cancels:
    assert locker.cancels is not None  # one server: latest wins, and restart beside it
    return locker.cancels


def hold(locker: RedisLocker, name: str, task_id: str) -> Lease:
    lease = locker.try_acquire(name, ttl=30, owner=Owner(task_id=task_id), renew=False)
    assert isinstance(lease, Lease)
    return lease


def test_a_newer_call_flags_the_running_holder(locker: RedisLocker, flags: Cancels) -> None:
    hold(locker, "job", "v1")
    assert flags.cancel_holder("job", by="v2") == "v1"
    assert flags.cancel_requested([("job", "v1"), ("job", "v2")]) == [True, False]


def test_a_free_lock_flags_no_one(
    locker: RedisLocker, flags: Cancels, redis_client: redis.Redis
) -> None:
    assert flags.cancel_holder("job", by="v2") is None
    assert redis_client.keys("*cancel*") == []


def test_a_call_never_flags_itself(locker: RedisLocker, flags: Cancels) -> None:
    hold(locker, "job", "v2")
    assert flags.cancel_holder("job", by="v2") is None
    assert flags.cancel_requested([("job", "v2")]) == [False]


def test_a_reserved_lock_flags_no_one(
    locker: RedisLocker, flags: Cancels, redis_client: redis.Redis
) -> None:
    # a lock reserved for a waiting call: its token is not an owner's, no body runs
    key = locker.keys("job").lock
    redis_client.set(key, "handoff-reserved-for-next-parked||1|0||v2", px=30_000)
    assert flags.cancel_holder("job", by="v3") is None


def test_a_flag_asks_only_the_call_it_names(locker: RedisLocker, flags: Cancels) -> None:
    lease = hold(locker, "job", "v1")
    flags.cancel_holder("job", by="v2")
    lease.release()
    hold(locker, "job", "v2")  # the newer call runs now: it was not asked to stop
    assert flags.cancel_requested([("job", "v2"), ("other", "v1")]) == [False, False]
    assert flags.cancel_requested([]) == []
