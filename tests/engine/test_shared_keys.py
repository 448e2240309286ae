"""Shared fence counter and finish-record buckets: bounded keys and bytes, promises kept."""

from __future__ import annotations

import pytest
import redis
from redis.crc import key_slot

from celery_singleton_lock.engine import Lease, Owner, RedisLocker
from celery_singleton_lock.engine.shared_keys import slot_tag
from celery_singleton_lock.errors import AlreadyFinished


def finish(locker: RedisLocker, name: str, task_id: str, remember_for: float = 3600) -> None:
    """One acks_late task ran to the end under lock ``name``: acquired and released with its
    finish record."""
    lease = locker.try_acquire(name, ttl=30, owner=Owner(task_id=task_id), renew=False)
    assert isinstance(lease, Lease)
    assert lease.release(remember_for=remember_for)


def test_a_thousand_fenced_lock_names_leave_one_counter_key(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    fences = []
    for i in range(1000):
        lease = locker.try_acquire(f"account-{i}", ttl=30, fencing=True, renew=False)
        assert isinstance(lease, Lease)
        fences.append(lease.fence)
        assert lease.release()
    assert fences == list(range(1, 1001))
    assert redis_client.keys("*") == [locker.shared.counter.encode()]


def test_a_thousand_finish_records_share_one_key_under_100_bytes_each(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    for i in range(1000):
        finish(locker, f"doc-{i}", f"{i:08d}-0000-4000-8000-000000000000")  # uuid-sized ids
    keys = redis_client.keys("*")
    assert len(keys) <= 2  # one bucket, or two when a bucket boundary fell in the loop
    used = sum(int(redis_client.memory_usage(key, samples=0) or 0) for key in keys)
    assert used / 1000 <= 100


def record_buckets_ago(client: redis.Redis, buckets: int, task_id: str) -> None:
    """A finish record of ``task_id`` (lifetime 1 h) in the bucket that many buckets before
    the server's current one."""
    seconds, _ = client.time()
    client.sadd(f"t:finished:3600000:{seconds * 1000 // 3_600_000 - buckets}", task_id)


def test_a_redelivered_copy_is_dropped_by_a_record_in_the_previous_bucket(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    record_buckets_ago(redis_client, 1, "t-1")
    with pytest.raises(AlreadyFinished):
        locker.try_acquire("job", ttl=30, owner=Owner(task_id="t-1"), unless_finished=True)


def test_a_record_two_buckets_old_is_gone_from_the_acquires_view(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    record_buckets_ago(redis_client, 2, "t-1")
    lease = locker.try_acquire("job", ttl=30, owner=Owner(task_id="t-1"), unless_finished=True)
    assert isinstance(lease, Lease)


def test_every_cluster_slot_has_a_tag_hashing_to_it() -> None:
    assert all(key_slot(slot_tag(slot).encode()) == slot for slot in range(16384))
    assert max(len(slot_tag(slot)) for slot in range(16384)) <= 4
