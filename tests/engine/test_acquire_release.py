"""Acquire and release: one round trip each, owner metadata, compare-and-delete."""

from __future__ import annotations

import time

import redis

from celery_singleton_lock.engine import Lease, LockHolder, Owner, RedisLocker, Renewer
from tests.support import CountingConnection


def test_acquire_returns_a_lease_with_a_128_bit_token(locker: RedisLocker) -> None:
    lease = locker.try_acquire("job", ttl=5)
    assert isinstance(lease, Lease)
    assert len(bytes.fromhex(lease.token)) == 16


def test_tokens_differ_between_acquisitions(locker: RedisLocker) -> None:
    tokens = set()
    for _ in range(200):
        lease = locker.try_acquire("job", ttl=5, renew=False)
        assert isinstance(lease, Lease)
        tokens.add(lease.token)
        assert lease.release()
    assert len(tokens) == 200


def test_owner_metadata_is_stored_in_the_lock_itself(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    before = time.time()
    locker.try_acquire("job", ttl=5, owner=Owner(task_id="t-1", host="w1", pid=42))
    fields = redis_client.hgetall(locker.keys("job").lock)
    assert fields[b"task_id"] == b"t-1"
    assert fields[b"host"] == b"w1"
    assert fields[b"pid"] == b"42"
    assert before * 1000 - 1 <= int(fields[b"acquired_at"]) <= time.time() * 1000 + 1


def test_second_acquire_reports_the_holder_and_its_remaining_ttl(locker: RedisLocker) -> None:
    locker.try_acquire("job", ttl=5, owner=Owner(task_id="first", host="w1", pid=7))
    holder = locker.try_acquire("job", ttl=5, owner=Owner(task_id="second"))
    assert isinstance(holder, LockHolder)
    assert (holder.task_id, holder.host, holder.pid) == ("first", "w1", 7)
    assert holder.ttl is not None and 4.0 < holder.ttl <= 5.0


def test_acquire_costs_one_round_trip(counting_client: redis.Redis) -> None:
    locker = RedisLocker(counting_client, prefix="t", renewer=Renewer(autostart=False))
    locker.try_acquire("warm-up", ttl=5)  # loads the script (NOSCRIPT fallback) once
    CountingConnection.reset()
    locker.try_acquire("job", ttl=5)
    assert CountingConnection.sent == ["EVALSHA"]


def test_release_costs_one_round_trip(counting_client: redis.Redis) -> None:
    locker = RedisLocker(counting_client, prefix="t", renewer=Renewer(autostart=False))
    locker.try_acquire("warm-up", ttl=5).release()  # type: ignore[union-attr]
    lease = locker.try_acquire("job", ttl=5)
    CountingConnection.reset()
    assert lease.release()  # type: ignore[union-attr]
    assert CountingConnection.sent == ["EVALSHA"]


def test_release_frees_the_lock(locker: RedisLocker, redis_client: redis.Redis) -> None:
    lease = locker.try_acquire("job", ttl=5)
    assert isinstance(lease, Lease)
    assert lease.release() is True
    assert not redis_client.exists(lease.key)


def test_release_twice_reports_not_owned_the_second_time(locker: RedisLocker) -> None:
    lease = locker.try_acquire("job", ttl=5)
    assert isinstance(lease, Lease)
    assert lease.release() is True
    assert lease.release() is False


def test_a_foreign_token_cannot_release(locker: RedisLocker, redis_client: redis.Redis) -> None:
    lease = locker.try_acquire("job", ttl=5)
    assert isinstance(lease, Lease)
    impostor = Lease(
        locker=locker,
        keys=lease.keys,
        token="0" * 32,
        ttl=5,
        owner=Owner(),
        fence=None,
        confirmed_at=0.0,
        deadline=None,
    )
    assert impostor.release() is False
    assert redis_client.hget(lease.key, "token") == lease.token.encode()


def test_release_after_expiry_leaves_the_new_owners_lock_intact(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    first = locker.try_acquire("job", ttl=0.1, renew=False)
    assert isinstance(first, Lease)
    time.sleep(0.2)
    second = locker.try_acquire("job", ttl=5, owner=Owner(task_id="second"))
    assert isinstance(second, Lease)
    assert first.release() is False
    assert redis_client.hget(second.key, "token") == second.token.encode()


def test_release_publishes_a_notification(locker: RedisLocker) -> None:
    lease = locker.try_acquire("job", ttl=5)
    assert isinstance(lease, Lease)
    pubsub = locker.subscribe_releases("job")
    try:
        lease.release()
        assert locker.wait_for_release(pubsub, timeout=2.0)
    finally:
        pubsub.close()


def test_waiting_for_release_times_out_while_the_lock_is_held(locker: RedisLocker) -> None:
    locker.try_acquire("job", ttl=5)
    pubsub = locker.subscribe_releases("job")
    try:
        assert locker.wait_for_release(pubsub, timeout=0.2) is False
    finally:
        pubsub.close()


def test_ttl_is_set_on_acquire(locker: RedisLocker, redis_client: redis.Redis) -> None:
    lease = locker.try_acquire("job", ttl=2.5, renew=False)
    assert isinstance(lease, Lease)
    assert 2000 < redis_client.pttl(lease.key) <= 2500


def test_lock_frees_itself_after_its_ttl_without_renewal(locker: RedisLocker) -> None:
    locker.try_acquire("job", ttl=0.2, renew=False)
    time.sleep(0.3)
    assert isinstance(locker.try_acquire("job", ttl=5), Lease)


def test_keys_share_one_hash_tag(locker: RedisLocker) -> None:
    keys = locker.keys("task.name:abc")
    assert keys.lock == "t:{task.name:abc}"
    assert keys.fence.startswith(keys.lock) and keys.channel.startswith(keys.lock)
