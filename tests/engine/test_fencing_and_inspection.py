"""Fencing tokens and lock inspection."""

from __future__ import annotations

import time

import redis

from celery_singleton_lock.engine import Lease, LockHolder, Owner, RedisLocker


def test_fences_strictly_increase_across_a_thousand_acquisitions_with_expiries(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    fences = []
    for i in range(1000):
        lease = locker.try_acquire("account-1", ttl=5, fencing=True, renew=False)
        assert isinstance(lease, Lease)
        fences.append(lease.fence)
        if i % 10 == 0:
            redis_client.delete(lease.key)  # expiry / crashed holder: never released
        elif i % 10 == 1:
            redis_client.pexpire(lease.key, 1)
            time.sleep(0.002)
        else:
            lease.release()
    assert all(b > a for a, b in zip(fences, fences[1:]))  # type: ignore[operator]
    assert locker.inspect.fence("account-1") == fences[-1]


def test_fences_strictly_increase_across_lock_names(locker: RedisLocker) -> None:
    a = locker.try_acquire("a", ttl=5, fencing=True)
    b = locker.try_acquire("b", ttl=5, fencing=True)
    assert isinstance(a, Lease) and isinstance(b, Lease)
    assert (a.fence, b.fence) == (1, 2)  # one counter for the server


def test_fence_counter_never_expires(locker: RedisLocker, redis_client: redis.Redis) -> None:
    locker.try_acquire("a", ttl=5, fencing=True)
    assert redis_client.pttl(locker.shared.counter) == -1


def test_without_fencing_no_counter_is_written(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = locker.try_acquire("a", ttl=5)
    assert isinstance(lease, Lease) and lease.fence is None
    assert redis_client.keys("*fence*") == []


def test_read_reports_the_holder(locker: RedisLocker) -> None:
    locker.try_acquire("a", ttl=5, fencing=True, owner=Owner(task_id="t1", host="h", pid=3))
    holder = locker.inspect.read("a")
    assert isinstance(holder, LockHolder)
    assert (holder.task_id, holder.host, holder.pid, holder.fence) == ("t1", "h", 3, 1)
    assert holder.ttl is not None and 0 < holder.ttl <= 5


def test_read_of_a_free_lock_is_none(locker: RedisLocker) -> None:
    assert locker.inspect.read("nobody") is None


def test_scan_lists_every_lock_under_the_prefix_and_nothing_else(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    for i in range(1203):
        locker.try_acquire(f"job-{i}", ttl=30, fencing=i % 2 == 0, renew=False)
    redis_client.set("unrelated", "x")
    other = RedisLocker(redis_client, prefix="other", renewer=locker.renewer)
    other.try_acquire("job-x", ttl=30, renew=False)
    keys = sorted(holder.key for holder in locker.inspect.scan(count=100))
    assert keys == sorted(locker.keys(f"job-{i}").lock for i in range(1203))


def test_release_abandoned_needs_the_exact_execution(locker: RedisLocker) -> None:
    owner = Owner(task_id="t1", host="node", pid=99999)
    locker.try_acquire("a", ttl=30, owner=owner, renew=False)
    assert not locker.release_abandoned("a", task_id="t2", host="node", pid=99999)
    assert not locker.release_abandoned("a", task_id="t1", host="node", pid=1)
    assert locker.release_abandoned("a", task_id="t1", host="node", pid=99999)
    assert locker.inspect.read("a") is None
