"""The queued marker of enqueue deduplication: ENQUEUE, its take-over by ACQUIRE, CLEAR_QUEUED."""

from __future__ import annotations

import pytest
import redis

from celery_singleton_lock import AlreadyFinished
from celery_singleton_lock.engine import AcquireRequest, Lease, LockHolder, Owner, RedisLocker


def test_the_first_enqueue_writes_the_marker_and_says_publish(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    assert locker.markers.enqueue("job", "t-1", ttl=60) is None
    assert redis_client.get(locker.keys("job").queued) == b"t-1"
    assert 0 < redis_client.pttl(locker.keys("job").queued) <= 60_000


def test_a_second_enqueue_gets_the_queued_task_id_and_writes_nothing(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    locker.markers.enqueue("job", "t-1", ttl=60)
    assert locker.markers.enqueue("job", "t-2", ttl=60) == "t-1"
    assert redis_client.get(locker.keys("job").queued) == b"t-1"


def test_an_enqueue_while_the_lock_is_held_gets_the_running_task_id(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = locker.try_acquire("job", ttl=30, owner=Owner(task_id="run|ning"), renew=False)
    assert isinstance(lease, Lease)
    assert locker.markers.enqueue("job", "t-2", ttl=60) == "run|ning"
    assert not redis_client.exists(locker.keys("job").queued)


def test_a_lock_held_without_a_task_id_does_not_deduplicate(locker: RedisLocker) -> None:
    lease = locker.try_acquire("job", ttl=30, owner=Owner(task_id=""), renew=False)
    assert isinstance(lease, Lease)
    assert locker.markers.enqueue("job", "t-2", ttl=60) is None


def test_a_message_is_never_blocked_by_its_own_marker(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    locker.markers.enqueue("job", "t-1", ttl=1)
    assert locker.markers.enqueue("job", "t-1", ttl=60) is None
    assert redis_client.pttl(locker.keys("job").queued) > 1000  # its TTL replaced


def test_a_resend_is_published_whatever_is_queued_or_running(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    locker.markers.enqueue("job", "other", ttl=60)
    assert locker.markers.enqueue("job", "t-1", ttl=60, resend=True) is None
    assert redis_client.get(locker.keys("job").queued) == b"other"
    locker.markers.clear_queued("job")
    lease = locker.try_acquire("job", ttl=30, owner=Owner(task_id="holder"), renew=False)
    assert isinstance(lease, Lease)
    assert locker.markers.enqueue("job", "t-1", ttl=60, resend=True) is None
    assert redis_client.get(locker.keys("job").queued) == b"t-1"


@pytest.mark.parametrize("fencing", [False, True])
def test_the_acquire_of_the_queued_task_id_takes_the_marker_in_the_same_call(
    locker: RedisLocker, redis_client: redis.Redis, fencing: bool
) -> None:
    locker.markers.enqueue("job", "t-1", ttl=60)
    lease = locker.try_acquire(
        "job", ttl=30, owner=Owner(task_id="t-1"), fencing=fencing, take_queued=True, renew=False
    )
    assert isinstance(lease, Lease)
    assert (lease.fence is not None) == fencing
    assert not redis_client.exists(locker.keys("job").queued)


def test_the_acquire_of_another_task_id_leaves_the_marker(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    locker.markers.enqueue("job", "t-1", ttl=60)
    lease = locker.try_acquire("job", ttl=30, owner=Owner(task_id="t-2"), take_queued=True)
    assert isinstance(lease, Lease)
    assert redis_client.get(locker.keys("job").queued) == b"t-1"


def test_a_duplicate_that_finds_the_lock_held_is_no_longer_queued(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    holder = locker.try_acquire("job", ttl=30, owner=Owner(task_id="holder"), renew=False)
    assert isinstance(holder, Lease)
    redis_client.set(locker.keys("job").queued, "t-1")  # queued before the holder started
    found = locker.try_acquire("job", ttl=30, owner=Owner(task_id="t-1"), take_queued=True)
    assert isinstance(found, LockHolder) and found.task_id == "holder"
    assert not redis_client.exists(locker.keys("job").queued)


def retried(task_id: str) -> AcquireRequest:
    """The acquire of a call that is sent again while the lock is held (policy retry)."""
    return AcquireRequest(
        "job", 30, owner=Owner(task_id=task_id), take_queued=True, queued_while_held=True
    )


def test_a_call_sent_again_while_the_lock_is_held_stays_queued(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    holder = locker.try_acquire("job", ttl=30, owner=Owner(task_id="holder"), renew=False)
    assert isinstance(holder, Lease)
    redis_client.set(locker.keys("job").queued, "t-1")
    found = locker.acquire(retried("t-1"))
    assert isinstance(found, LockHolder) and found.task_id == "holder"
    assert redis_client.get(locker.keys("job").queued) == b"t-1"


def test_a_call_sent_again_takes_its_marker_when_it_gets_the_lock(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    redis_client.set(locker.keys("job").queued, "t-1")
    lease = locker.acquire(retried("t-1"))
    assert isinstance(lease, Lease)
    lease.release()
    assert not redis_client.exists(locker.keys("job").queued)


def test_a_call_sent_again_that_already_finished_takes_its_marker(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    done = locker.try_acquire("job", ttl=30, owner=Owner(task_id="t-1"), renew=False)
    assert isinstance(done, Lease)
    assert done.release(remember_for=60)
    holder = locker.try_acquire("job", ttl=30, owner=Owner(task_id="holder"), renew=False)
    assert isinstance(holder, Lease)
    redis_client.set(locker.keys("job").queued, "t-1")
    with pytest.raises(AlreadyFinished):
        locker.acquire(retried("t-1")._replace(unless_finished=True, finished_ttl=60))
    assert not redis_client.exists(locker.keys("job").queued)


def test_take_queued_and_unless_finished_work_together(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = locker.try_acquire("job", ttl=30, owner=Owner(task_id="t-1"), renew=False)
    assert isinstance(lease, Lease)
    assert lease.release(remember_for=60)
    locker.markers.enqueue("job", "t-1", ttl=60)
    with pytest.raises(AlreadyFinished):
        locker.try_acquire(
            "job",
            ttl=30,
            owner=Owner(task_id="t-1"),
            unless_finished=True,
            take_queued=True,
            finished_ttl=60,
        )
    assert not redis_client.exists(locker.keys("job").queued)


def test_clear_queued_with_a_task_id_deletes_only_that_ids_marker(locker: RedisLocker) -> None:
    locker.markers.enqueue("job", "t-1", ttl=60)
    assert not locker.markers.clear_queued("job", "t-2")
    assert locker.markers.queued("job") == "t-1"
    assert locker.markers.clear_queued("job", "t-1")
    assert locker.markers.queued("job") is None


def test_clear_queued_without_a_task_id_deletes_any_marker(locker: RedisLocker) -> None:
    locker.markers.enqueue("job", "t-1", ttl=60)
    assert locker.markers.clear_queued("job")
    assert not locker.markers.clear_queued("job")


def test_with_running_false_only_a_queued_message_is_a_duplicate(locker: RedisLocker) -> None:
    lease = locker.try_acquire("job", ttl=30, owner=Owner(task_id="holder"), renew=False)
    assert isinstance(lease, Lease)
    assert locker.markers.enqueue("job", "t-1", ttl=60, running=False) is None
    assert locker.markers.enqueue("job", "t-2", ttl=60, running=False) == "t-1"


def test_queued_for_is_the_markers_remaining_life(locker: RedisLocker) -> None:
    assert locker.markers.queued_for("job") is None
    locker.markers.enqueue("job", "t-1", ttl=60)
    remaining = locker.markers.queued_for("job")
    assert remaining is not None and 0 < remaining <= 60
