"""``lock_cooldown``: a release that leaves the key taken for a while (engine/kinds/cooldown.py)."""

from __future__ import annotations

import redis

from celery_singleton_lock.engine import Lease, LockHolder, Owner, RedisLocker
from celery_singleton_lock.engine.waiting import subscribe_releases, wait_for_release
from tests.support import wait_until


def held(locker: RedisLocker, task_id: str = "runner", limit: int = 1) -> Lease:
    lease = locker.try_acquire("job", 10.0, owner=Owner(task_id=task_id), limit=limit)
    assert isinstance(lease, Lease)
    return lease


def test_an_acquire_inside_the_cooldown_finds_the_key_held_cooling(locker: RedisLocker) -> None:
    assert locker.cooldown.release_cooling(held(locker), 5.0) is True
    holder = locker.try_acquire("job", 10.0)
    assert isinstance(holder, LockHolder)
    assert holder.cooling and holder.task_id == "runner"


def test_the_cooldown_left_is_the_holders_ttl(locker: RedisLocker) -> None:
    locker.cooldown.release_cooling(held(locker), 5.0)
    holder = locker.try_acquire("job", 10.0)
    assert isinstance(holder, LockHolder) and holder.ttl is not None and 4.0 < holder.ttl <= 5.0


def test_a_release_into_the_cooldown_is_published_to_the_waiters(locker: RedisLocker) -> None:
    # a waiter (policy wait) then re-reads the key and sleeps for the cooldown left, not for
    # the TTL it read of the running holder (issue 30, item 3)
    lease = held(locker)
    pubsub = subscribe_releases(locker.client, locker.keys("job").channel)
    try:
        locker.cooldown.release_cooling(lease, 5.0)
        assert wait_for_release(pubsub, timeout=2.0)
    finally:
        pubsub.close()


def test_a_plain_holder_is_not_cooling(locker: RedisLocker) -> None:
    held(locker)
    holder = locker.try_acquire("job", 10.0)
    assert isinstance(holder, LockHolder) and not holder.cooling


def test_the_key_is_free_again_after_the_cooldown(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = held(locker)
    locker.cooldown.release_cooling(lease, 0.2)
    wait_until(lambda: not redis_client.exists(lease.key), timeout=5)  # the cooldown ends
    assert isinstance(locker.try_acquire("job", 10.0), Lease)


def test_a_cooldown_release_of_a_lease_no_longer_ours_changes_nothing(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = held(locker)
    redis_client.delete(lease.key)
    assert locker.cooldown.release_cooling(lease, 5.0) is False
    assert redis_client.exists(lease.key) == 0


def test_a_key_in_its_cooldown_is_neither_renewed_nor_released_by_owner(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = held(locker)
    locker.cooldown.release_cooling(lease, 5.0)
    owner = lease.owner
    assert locker.renew_by_owner([("job", owner, 60.0)]) == [0]
    assert not locker.release_abandoned("job", task_id="runner", host=owner.host, pid=owner.pid)
    assert redis_client.pttl(lease.key) <= 5000


def test_a_slot_in_its_cooldown_stays_taken(locker: RedisLocker) -> None:
    first = held(locker, "a", limit=2)
    held(locker, "b", limit=2)
    locker.cooldown.release_cooling(first, 5.0)
    assert isinstance(locker.try_acquire("job", 10.0, limit=2), LockHolder)
