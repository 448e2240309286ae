"""The hand-off queue behind a mutex (the slot queue with one slot): ACQUIRE_SLOT_OR_PARK,
HAND_ON_SLOTS and the sweeper's HANDOFF_DUE."""

from __future__ import annotations

import time
from typing import Any, Optional, Union

import pytest
import redis

from celery_singleton_lock import AlreadyFinished
from celery_singleton_lock.engine import Lease, LockHolder, Owner, RedisLocker
from celery_singleton_lock.engine.lease import Parked
from tests.support import SHORT_TTL, wait_until_due


def reserved_for(holder: LockHolder) -> Optional[str]:
    """The task id a hand-off reservation (pid 0, no host) keeps the lock for, or None."""
    return holder.task_id if holder.pid == 0 and not holder.host else None


def attempt(
    locker: RedisLocker, task_id: str, *, ttl: float = 30, reservation_ttl: float = 30, **kw: bool
) -> Union[Lease, LockHolder, Parked]:
    """One acquire-or-park of the lock "job" by ``task_id``, whose message is ``msg-<id>``."""
    return locker.try_acquire(
        "job",
        ttl=ttl,
        owner=Owner(task_id=task_id),
        renew=False,
        park=f"msg-{task_id}".encode(),
        reservation_ttl=reservation_ttl,
        **kw,
    )


def release(locker: RedisLocker, lease: Lease, **options: Any) -> tuple[bool, Optional[bytes]]:
    """A release of the one slot: whether it was ours, and the one message handed on."""
    owned, handed = locker.queue.release_handing_on(lease, limit=1, **options)
    assert len(handed) <= 1
    return owned, handed[0] if handed else None


def sweep(locker: RedisLocker, *, reservation_ttl: float) -> Optional[bytes]:
    """A sweeper's step on the lock: the one message handed on, or None."""
    handed = locker.queue.hand_on("job", reservation_ttl=reservation_ttl)
    assert len(handed) <= 1
    return handed[0] if handed else None


def held(locker: RedisLocker) -> Optional[LockHolder]:
    """Who holds lock "job" (a call, or a reservation), read through the public reading API."""
    return locker.inspect.read("job")


def ttl_left(locker: RedisLocker) -> float:
    holder = held(locker)
    assert holder is not None and holder.ttl is not None
    return holder.ttl


def parked_ids(locker: RedisLocker) -> list[bytes]:
    return list(locker.client.zrange(locker.keys("job").parked, 0, -1))


def test_a_free_lock_is_taken_without_parking(locker: RedisLocker) -> None:
    assert isinstance(attempt(locker, "a"), Lease)
    assert parked_ids(locker) == []


def test_a_duplicate_is_parked_behind_the_holder_in_arrival_order(locker: RedisLocker) -> None:
    assert isinstance(attempt(locker, "a"), Lease)
    second, third = attempt(locker, "b"), attempt(locker, "c")
    assert isinstance(second, Parked) and isinstance(third, Parked)
    assert (second.position, third.position) == (1, 2)
    assert second.holder is not None and second.holder.task_id == "a"
    assert second.handed is None
    assert parked_ids(locker) == [b"b", b"c"]


def test_parking_the_same_task_id_twice_keeps_its_place(locker: RedisLocker) -> None:
    attempt(locker, "a")
    attempt(locker, "b")
    attempt(locker, "c")
    again = attempt(locker, "b")
    assert isinstance(again, Parked) and again.position == 1
    assert parked_ids(locker) == [b"b", b"c"]


def test_a_copy_of_the_holders_own_task_id_is_not_parked(locker: RedisLocker) -> None:
    attempt(locker, "a")
    copy = attempt(locker, "a")
    assert isinstance(copy, LockHolder) and copy.task_id == "a"
    assert parked_ids(locker) == []


def test_the_release_reserves_the_lock_for_the_oldest_parked_and_returns_its_message(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = attempt(locker, "a")
    assert isinstance(lease, Lease)
    attempt(locker, "b")
    attempt(locker, "c")
    owned, message = release(locker, lease, reservation_ttl=5)
    assert (owned, message) == (True, b"msg-b")
    slot = held(locker)
    assert slot is not None and reserved_for(slot) == "b"
    assert slot.ttl is not None and 0 < slot.ttl <= 5


def test_only_the_reserved_task_id_takes_a_reserved_lock(locker: RedisLocker) -> None:
    lease = attempt(locker, "a")
    assert isinstance(lease, Lease)
    attempt(locker, "b")
    release(locker, lease, reservation_ttl=5)
    newcomer = attempt(locker, "z")
    assert isinstance(newcomer, Parked)
    assert newcomer.holder is not None and newcomer.holder.task_id == "b"
    assert isinstance(attempt(locker, "b"), Lease)
    assert parked_ids(locker) == [b"z"]


def test_releases_hand_the_lock_on_in_arrival_order(locker: RedisLocker) -> None:
    lease = attempt(locker, "a")
    for task_id in "bcde":
        attempt(locker, task_id)
    ran = []
    while isinstance(lease, Lease):
        ran.append(lease.owner.task_id)
        _, message = release(locker, lease, reservation_ttl=5)
        if message is None:
            break
        next_id = message.decode().removeprefix("msg-")
        lease = attempt(locker, next_id)
    assert ran == ["a", "b", "c", "d", "e"]
    assert held(locker) is None
    assert locker.client.zscore(locker.shared.handoff_index(locker.keys("job").lock), "job") is None


def test_a_release_with_nothing_parked_frees_the_lock(locker: RedisLocker) -> None:
    lease = attempt(locker, "a")
    assert isinstance(lease, Lease)
    assert release(locker, lease, reservation_ttl=5) == (True, None)
    assert held(locker) is None


def test_a_release_by_a_lease_that_lost_the_lock_hands_off_nothing(locker: RedisLocker) -> None:
    lease = attempt(locker, "a")
    assert isinstance(lease, Lease)
    attempt(locker, "b")
    owner = lease.owner
    assert locker.release_abandoned("job", task_id="a", host=owner.host, pid=owner.pid)
    assert isinstance(attempt(locker, "x"), Parked)  # free, but "b" is older: reserved for it
    assert release(locker, lease, reservation_ttl=5) == (False, None)


def test_a_free_lock_with_older_parked_ids_is_handed_to_the_oldest_not_taken(
    locker: RedisLocker,
) -> None:
    lease = attempt(locker, "a", ttl=SHORT_TTL)
    assert isinstance(lease, Lease)
    attempt(locker, "b")
    wait_until_due(locker, "job")  # the holder died: its lock expired
    newcomer = attempt(locker, "c")
    assert isinstance(newcomer, Parked)
    assert newcomer.handed == b"msg-b" and newcomer.holder is None
    assert parked_ids(locker) == [b"b", b"c"]


def test_the_sweeper_finds_a_dead_holders_lock_once_it_expired_and_hands_it_off(
    locker: RedisLocker,
) -> None:
    assert isinstance(attempt(locker, "a", ttl=SHORT_TTL), Lease)
    attempt(locker, "b")
    assert locker.queue.hand_off_due().names == []  # not due before the holder's TTL runs out
    wait_until_due(locker, "job")
    assert sweep(locker, reservation_ttl=5) == b"msg-b"
    assert (
        locker.queue.hand_off_due().names == []
    )  # reserved: due again when the reservation runs out


def test_the_sweeper_leaves_a_held_lock_and_looks_again_at_its_ttl(locker: RedisLocker) -> None:
    lease = attempt(locker, "a", ttl=SHORT_TTL)
    assert isinstance(lease, Lease)
    attempt(locker, "b")
    assert locker.renew_by_owner([("job", lease.owner, 30.0)]) == []  # renewed meanwhile
    wait_until_due(locker, "job")  # at its first TTL's end: the sweeper looks, and finds it held
    assert sweep(locker, reservation_ttl=5) is None
    assert locker.queue.hand_off_due().names == []
    score = locker.client.zscore(locker.shared.handoff_index(locker.keys("job").lock), "job")
    assert score is not None and score > time.time() * 1000 + 20_000


def test_a_reservation_that_ran_out_is_handed_to_the_same_task_id_again(
    locker: RedisLocker,
) -> None:
    lease = attempt(locker, "a")
    assert isinstance(lease, Lease)
    attempt(locker, "b")
    attempt(locker, "c")
    assert release(locker, lease, reservation_ttl=0.2)[1] == b"msg-b"
    time.sleep(0.3)  # b's message was lost on its way
    assert locker.queue.hand_off_due().names == ["job"]
    assert sweep(locker, reservation_ttl=5) == b"msg-b"


def test_a_published_hand_off_makes_its_short_reservation_live_the_whole_timeout(
    locker: RedisLocker,
) -> None:
    lease = attempt(locker, "a")
    assert isinstance(lease, Lease)
    attempt(locker, "b")
    assert release(locker, lease, reservation_ttl=3)[1] == b"msg-b"  # the send window
    assert ttl_left(locker) <= 3
    assert locker.queue.handed("job", "b", reservation_ttl=60) is True
    assert ttl_left(locker) > 50
    score = locker.client.zscore(locker.shared.handoff_index(locker.keys("job").lock), "job")
    assert score is not None and score > time.time() * 1000 + 50_000  # looked at when it ends


def test_a_hand_off_published_after_its_reservation_was_taken_changes_nothing(
    locker: RedisLocker,
) -> None:
    lease = attempt(locker, "a")
    assert isinstance(lease, Lease)
    attempt(locker, "b")
    release(locker, lease, reservation_ttl=3)
    taken = attempt(locker, "b", ttl=30)
    assert isinstance(taken, Lease)
    assert locker.queue.handed("job", "b", reservation_ttl=60) is False
    slot = held(locker)
    assert slot is not None and reserved_for(slot) is None and slot.task_id == "b"
    assert ttl_left(locker) > 25


def test_the_sweeper_is_told_when_the_next_lock_falls_due(locker: RedisLocker) -> None:
    assert locker.queue.hand_off_due().next_in is None  # nothing parked anywhere
    assert isinstance(attempt(locker, "a", ttl=20), Lease)
    attempt(locker, "b")
    due = locker.queue.hand_off_due()
    assert due.names == [] and due.next_in is not None and 15 < due.next_in <= 20


def test_a_finished_task_id_takes_nothing_and_is_not_parked(locker: RedisLocker) -> None:
    lease = attempt(locker, "a")
    assert isinstance(lease, Lease)
    release(locker, lease, reservation_ttl=5, remember_for=3600)  # the default
    with pytest.raises(AlreadyFinished):
        attempt(locker, "a", unless_finished=True)
    assert parked_ids(locker) == []


def test_parking_hands_out_fences_in_execution_order(locker: RedisLocker) -> None:
    lease = attempt(locker, "a", fencing=True)
    assert isinstance(lease, Lease) and lease.fence == 1
    attempt(locker, "b", fencing=True)
    release(locker, lease, reservation_ttl=5)
    taken = attempt(locker, "b", fencing=True)
    assert isinstance(taken, Lease) and taken.fence == 2


# -- a parked task id that will never take its lock (revoked, expired, unreadable) ---------


def test_dropping_the_task_id_the_lock_is_reserved_for_hands_it_to_the_next_at_once(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = attempt(locker, "a")
    assert isinstance(lease, Lease)
    attempt(locker, "b")
    attempt(locker, "c")
    assert release(locker, lease, reservation_ttl=30)[1] == b"msg-b"
    assert locker.queue.drop_parked("job", "b", reservation_ttl=30) == b"msg-c"
    assert parked_ids(locker) == [b"c"]
    assert not redis_client.hexists(locker.keys("job").parked_messages, "b")
    slot = held(locker)
    assert slot is not None and reserved_for(slot) == "c"


def test_dropping_the_last_reserved_task_id_frees_the_lock(locker: RedisLocker) -> None:
    lease = attempt(locker, "a")
    assert isinstance(lease, Lease)
    attempt(locker, "b")
    release(locker, lease, reservation_ttl=30)
    assert locker.queue.drop_parked("job", "b", reservation_ttl=30) is True
    assert held(locker) is None
    assert isinstance(attempt(locker, "z"), Lease)


def test_dropping_a_parked_task_id_behind_a_holder_keeps_the_others_in_order(
    locker: RedisLocker,
) -> None:
    lease = attempt(locker, "a")
    for task_id in "bcd":
        attempt(locker, task_id)
    assert locker.queue.drop_parked("job", "c", reservation_ttl=30) is True
    assert parked_ids(locker) == [b"b", b"d"]
    assert isinstance(lease, Lease)
    assert release(locker, lease, reservation_ttl=30)[1] == b"msg-b"


def test_dropping_never_touches_a_lock_held_by_that_task_id(locker: RedisLocker) -> None:
    lease = attempt(locker, "a")
    attempt(locker, "b")
    assert locker.queue.drop_parked("job", "a", reservation_ttl=30) is False
    assert isinstance(lease, Lease) and lease.held
    assert release(locker, lease, reservation_ttl=30) == (True, b"msg-b")


def test_release_all_at_shutdown_makes_a_lock_with_parked_ids_due_for_a_hand_off_now(
    locker: RedisLocker,
) -> None:
    lease = locker.try_acquire("job", ttl=30, owner=Owner(task_id="a"), park=b"msg-a")
    assert isinstance(lease, Lease)
    attempt(locker, "b")
    assert locker.queue.hand_off_due().names == []  # not before the holder's TTL of 30 s
    assert locker.release_all() == 1
    assert locker.queue.hand_off_due().names == ["job"]
    assert sweep(locker, reservation_ttl=5) == b"msg-b"
