"""Prepared acquires (``backend.prepare``): checked once, then the same outcomes, keys, values
and round trips as ``backend.acquire`` of the same request, on a real server."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from celery_singleton_lock import AlreadyFinished, LockConfigurationError
from celery_singleton_lock.engine import (
    AcquireRequest,
    Lease,
    LockHolder,
    Owner,
    RedisLocker,
    Renewer,
)
from celery_singleton_lock.engine.acquire_request import ChosenAcquire
from celery_singleton_lock.engine.kinds.mutex import PackedMutex
from tests.engine.conftest import stop_renewing, stored_fields
from tests.support import CountingConnection

OWNER = Owner(task_id="t-1", host="w1", pid=42)


def leased(outcome: Any) -> Lease:
    assert isinstance(outcome, Lease), outcome
    return outcome


def test_a_mutex_on_one_server_is_packed_once(locker: RedisLocker) -> None:
    assert isinstance(locker.prepare(AcquireRequest("", 5)), PackedMutex)


@pytest.mark.parametrize(
    "fields",
    [{"limit": 3}, {"rate": (5, 1.0)}, {"min_replicas": 1}],
    ids=["slots", "rate", "replica acks"],
)
def test_a_request_beyond_the_mutex_goes_to_the_kind_chosen_for_it(
    locker: RedisLocker, fields: dict[str, Any]
) -> None:
    assert isinstance(locker.prepare(AcquireRequest("", 5, **fields)), ChosenAcquire)


def test_a_blocking_pool_goes_to_the_kind_chosen_for_it(redis_client: redis.Redis) -> None:
    pool = redis.BlockingConnectionPool(port=redis_client.connection_pool.connection_kwargs["port"])
    blocking = RedisLocker(redis.Redis(connection_pool=pool), prefix="t")
    try:
        prepared = blocking.prepare(AcquireRequest("", 5, renew=False))
        assert isinstance(prepared, ChosenAcquire)
        assert leased(prepared.acquire("job", OWNER)).release()
    finally:
        blocking.close()


def test_the_lock_value_is_the_one_acquire_stores(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = leased(locker.prepare(AcquireRequest("", 5)).acquire("job", OWNER))
    fields = stored_fields(redis_client, locker.keys("job").lock)
    assert fields["token"] == lease.token.encode()
    assert (fields["fence"], fields["pid"], fields["host"], fields["task_id"]) == (
        b"",
        b"42",
        b"w1",
        b"t-1",
    )
    assert 4000 < redis_client.pttl(locker.keys("job").lock) <= 5000


def test_an_acquired_lease_is_renewed(locker: RedisLocker) -> None:
    lease = leased(locker.prepare(AcquireRequest("", 5)).acquire("job", OWNER))
    assert lease in locker.renewer.leases()


def test_a_request_without_renewal_is_not_renewed(locker: RedisLocker) -> None:
    lease = leased(locker.prepare(AcquireRequest("", 5, renew=False)).acquire("job", OWNER))
    assert lease not in locker.renewer.leases()


def test_a_held_lock_answers_its_holder(locker: RedisLocker) -> None:
    prepared = locker.prepare(AcquireRequest("", 5))
    leased(prepared.acquire("job", OWNER))
    holder = prepared.acquire("job", Owner(task_id="t-2", host="w2", pid=7))
    assert isinstance(holder, LockHolder)
    assert (holder.task_id, holder.host, holder.pid) == ("t-1", "w1", 42)
    assert holder.ttl is not None and 4 < holder.ttl <= 5


def test_each_acquire_is_one_round_trip(counting_client: redis.Redis) -> None:
    renewer = Renewer()
    locker = RedisLocker(counting_client, prefix="t", renewer=renewer)
    prepared = locker.prepare(AcquireRequest("", 5))
    leased(prepared.acquire("warm", OWNER))  # the first call loads nothing: EVALSHA is known
    CountingConnection.reset()
    for name in ("a", "b", "c"):
        leased(prepared.acquire(name, OWNER))
    assert CountingConnection.sent == ["EVALSHA"] * 3
    stop_renewing(renewer)


def test_a_server_that_lost_its_scripts_is_sent_the_script_again(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    prepared = locker.prepare(AcquireRequest("", 5))
    leased(prepared.acquire("before", OWNER))
    redis_client.script_flush()
    assert leased(prepared.acquire("after", OWNER)).key == locker.keys("after").lock


def test_fences_increase_per_lock(locker: RedisLocker) -> None:
    prepared = locker.prepare(AcquireRequest("", 5, fencing=True))
    first = leased(prepared.acquire("job", OWNER))
    assert first.release()
    second = leased(prepared.acquire("job", OWNER))
    assert first.fence is not None and second.fence is not None
    assert second.fence > first.fence


def test_a_finished_task_id_takes_nothing(locker: RedisLocker) -> None:
    prepared = locker.prepare(AcquireRequest("", 5, unless_finished=True, finished_ttl=60))
    lease = leased(prepared.acquire("job", OWNER))
    assert locker.release(lease, remember_for=60)
    with pytest.raises(AlreadyFinished):
        prepared.acquire("job", OWNER)


def test_the_time_limit_of_the_call_bounds_its_renewal(locker: RedisLocker) -> None:
    lease = leased(locker.prepare(AcquireRequest("", 5)).acquire("job", OWNER, 30.0))
    assert lease.deadline is not None
    assert lease.deadline - lease.confirmed_at == pytest.approx(30.0)


def test_a_bad_ttl_is_refused_when_prepared(locker: RedisLocker) -> None:
    with pytest.raises(ValueError, match="ttl must be a positive number"):
        locker.prepare(AcquireRequest("", 0))


def test_a_bad_time_limit_is_refused_at_the_call(locker: RedisLocker) -> None:
    with pytest.raises(ValueError, match="max_lifetime must be positive"):
        locker.prepare(AcquireRequest("", 5)).acquire("job", OWNER, 0.0)


def test_a_finish_record_needs_a_task_id_at_the_call(locker: RedisLocker) -> None:
    prepared = locker.prepare(AcquireRequest("", 5, unless_finished=True))
    with pytest.raises(ValueError, match="need an owner with a task_id"):
        prepared.acquire("job", Owner(task_id="", host="w1", pid=42))


def test_a_bad_lock_name_is_refused_at_the_call(locker: RedisLocker) -> None:
    with pytest.raises(LockConfigurationError, match="lock name"):
        locker.prepare(AcquireRequest("", 5)).acquire("with space", OWNER)
