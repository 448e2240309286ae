"""Shared fence counter and finish-record buckets: bounded keys and bytes, promises kept, and
the previous version's per-name keys honoured during an upgrade."""

from __future__ import annotations

import pytest
import redis
from celery import Celery
from redis.crc import key_slot

from celery_singleton_lock.celery.config.lockers import forget_locker, locker_for
from celery_singleton_lock.engine import Lease, Owner, RedisLocker, Renewer
from celery_singleton_lock.engine.shared_keys import slot_tag
from celery_singleton_lock.errors import AlreadyFinished, LockConfigurationError
from celery_singleton_lock.testing import RedisServer


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


def test_a_finish_record_of_the_previous_version_still_drops_the_copy(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    redis_client.set(locker.keys("job").finished("t-1"), "1|1700000000000|42|w1|t-1", px=60000)
    with pytest.raises(AlreadyFinished):
        locker.try_acquire("job", ttl=30, owner=Owner(task_id="t-1"), unless_finished=True)


def test_a_per_name_counter_of_the_previous_version_lifts_the_next_fence_above_it(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    redis_client.set(locker.keys("old").fence, 500)
    lease = locker.try_acquire("old", ttl=30, fencing=True, renew=False)
    assert isinstance(lease, Lease) and lease.fence == 501
    assert redis_client.get(locker.keys("old").fence) == b"501"  # the old version counts on
    other = locker.try_acquire("new", ttl=30, fencing=True, renew=False)
    assert isinstance(other, Lease) and other.fence == 502


def test_beside_the_previous_version_no_fence_falls_below_one_handed_out(
    redis_client: redis.Redis,
) -> None:
    """An upgrade: this version with ``upgrading`` and the previous one (its ACQUIRE: INCR of
    the per-name counter) take turns on fresh and old names."""
    new = RedisLocker(redis_client, prefix="t", renewer=Renewer(), upgrading=True)
    handed: dict[str, list[int]] = {"a": [], "b": []}
    for turn in range(40):
        name = "ab"[turn % 2]
        if turn % 3 == 0:  # the previous version
            handed[name].append(int(redis_client.incr(new.keys(name).fence)))
        else:
            lease = new.try_acquire(name, ttl=30, fencing=True, renew=False)
            assert isinstance(lease, Lease) and lease.fence is not None
            handed[name].append(lease.fence)
            assert lease.release()
    for fences in handed.values():
        assert all(b > a for a, b in zip(fences, fences[1:]))


def test_while_upgrading_a_release_also_writes_the_previous_versions_record(
    redis_client: redis.Redis,
) -> None:
    new = RedisLocker(redis_client, prefix="t", renewer=Renewer(), upgrading=True)
    finish(new, "job", "t-1", remember_for=60)
    assert 0 < redis_client.pttl(new.keys("job").finished("t-1")) <= 60000


def test_every_cluster_slot_has_a_tag_hashing_to_it() -> None:
    assert all(key_slot(slot_tag(slot).encode()) == slot for slot in range(16384))
    assert max(len(slot_tag(slot)) for slot in range(16384)) <= 4


def test_singleton_lock_upgrading_makes_a_locker_that_writes_the_per_name_keys(
    redis_server: RedisServer,
) -> None:
    app = Celery(set_as_current=False)
    app.conf.update(singleton_lock_url=redis_server.url, singleton_lock_upgrading=True)
    try:
        locker = locker_for(app)
        assert isinstance(locker, RedisLocker) and locker.upgrading
    finally:
        forget_locker(app)


def test_singleton_lock_upgrading_must_be_a_boolean() -> None:
    app = Celery(set_as_current=False)
    app.conf.update(singleton_lock_url="redis://127.0.0.1:1/0", singleton_lock_upgrading="yes")
    with pytest.raises(LockConfigurationError, match="singleton_lock_upgrading must be True"):
        locker_for(app)
