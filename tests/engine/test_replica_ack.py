"""min_replicas: the acquire (and its fence) is on that many replicas before the lock is held,
checked with WAIT in the acquire's own round trip, on a real primary and replica."""

from __future__ import annotations

from typing import Iterator

import pytest
import redis

from celery_singleton_lock import LockBackendUnavailable
from celery_singleton_lock.engine import Lease, RedisLocker, Renewer
from celery_singleton_lock.testing import RedisServer, primary_with_replica
from tests.support import CountingConnection


@pytest.fixture(scope="module")
def primary_and_replica() -> Iterator[tuple[RedisServer, RedisServer]]:
    with primary_with_replica() as servers:
        yield servers


def locker_on(server: RedisServer) -> RedisLocker:
    return RedisLocker(server.client(), prefix="t", renewer=Renewer(autostart=False))


def test_a_lock_held_with_min_replicas_is_already_on_the_replica(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    primary, replica = primary_and_replica
    lease = locker_on(primary).try_acquire("job-a", 30, min_replicas=1)
    assert isinstance(lease, Lease)
    assert replica.client().get(lease.key) is not None  # read at once, no polling
    lease.release()


def test_the_fence_of_a_lock_held_with_min_replicas_is_already_on_the_replica(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    primary, replica = primary_and_replica
    locker = locker_on(primary)
    lease = locker.try_acquire("job-f", 30, fencing=True, min_replicas=1)
    assert isinstance(lease, Lease)
    assert int(replica.client().get(locker.shared.counter)) == lease.fence
    lease.release()


def test_an_acquire_with_min_replicas_costs_one_round_trip(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    primary, _ = primary_and_replica
    pool = redis.ConnectionPool(
        host="127.0.0.1", port=primary.port, connection_class=CountingConnection
    )
    locker = RedisLocker(redis.Redis(connection_pool=pool), renewer=Renewer(autostart=False))
    locker.try_acquire("warm", 30, min_replicas=1).release()  # type: ignore[union-attr]
    CountingConnection.reset()
    lease = locker.try_acquire("job-r", 30, min_replicas=1)
    assert isinstance(lease, Lease)
    assert CountingConnection.sent == ["PIPELINE"]  # EVALSHA and WAIT, sent together
    lease.release()
    pool.disconnect()


def test_an_acquire_with_min_replicas_loads_its_script_after_a_flush(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    primary, _ = primary_and_replica
    locker = locker_on(primary)
    primary.client().script_flush()
    lease = locker.try_acquire("job-s", 30, min_replicas=1)
    assert isinstance(lease, Lease)
    lease.release()


def test_too_few_replicas_releases_the_lock_and_raises_backend_unavailable(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    locker = locker_on(redis_server)
    with pytest.raises(LockBackendUnavailable, match="only 0 of 1 replica"):
        locker.try_acquire("job", 30, min_replicas=1, replica_timeout=0.05)
    assert not redis_client.exists(locker.keys("job").lock)
    assert locker.renewer.leases() == []
