"""Latest wins on one server: ACQUIRE_OR_REPLACE and RELEASE_LATEST (policy ``replace``, and
``lock_debounce``), with the hand-off sweeper's steps of policy ``queue``."""

from __future__ import annotations

import time
from typing import Optional, Union

import pytest

from celery_singleton_lock.engine import Latest, Lease, LockHolder, Owner, RedisLocker
from celery_singleton_lock.engine.lease import Parked
from celery_singleton_lock.errors import AlreadySuperseded
from tests.support import wait_until


def attempt(
    locker: RedisLocker, task_id: str, latest: Optional[Latest] = None
) -> Union[Lease, LockHolder, Parked]:
    """One acquire of the lock "job" by ``task_id`` whose message is ``<id>\\nmsg``."""
    return locker.try_acquire(
        "job",
        ttl=30,
        owner=Owner(task_id=task_id),
        renew=False,
        park=f"{task_id}\nmsg".encode(),
        reservation_ttl=30,
        latest=latest or Latest(),
    )


def waiting_ids(locker: RedisLocker) -> list[bytes]:
    return list(locker.client.zrange(locker.keys("job").parked, 0, -1))


def test_a_free_lock_is_taken_at_once_without_a_debounce(locker: RedisLocker) -> None:
    assert isinstance(attempt(locker, "a"), Lease)
    assert waiting_ids(locker) == []


def test_a_newer_duplicate_takes_the_waiting_place_and_names_the_displaced_call(
    locker: RedisLocker,
) -> None:
    attempt(locker, "a")
    second = attempt(locker, "b")
    third = attempt(locker, "c")
    assert isinstance(second, Parked) and second.displaced == ()
    assert isinstance(third, Parked) and third.position == 1
    assert third.displaced == (b"b\nmsg",)
    assert waiting_ids(locker) == [b"c"]
    assert locker.client.hkeys(locker.keys("job").parked_messages) == [b"c"]


def test_the_waiting_call_sent_again_keeps_its_place_and_displaces_nothing(
    locker: RedisLocker,
) -> None:
    attempt(locker, "a")
    attempt(locker, "b")
    again = attempt(locker, "b")
    assert isinstance(again, Parked) and again.displaced == ()
    assert waiting_ids(locker) == [b"b"]


def test_the_release_hands_the_lock_to_the_newest_call_only(locker: RedisLocker) -> None:
    holder = attempt(locker, "a")
    assert isinstance(holder, Lease)
    for task_id in "bcd":
        attempt(locker, task_id)
    owned, handed = locker.latest.release_latest(holder, reservation_ttl=30)
    assert owned and handed == b"d\nmsg"
    assert isinstance(attempt(locker, "d"), Lease)  # its reservation taken over
    assert waiting_ids(locker) == []


def test_a_call_whose_reservation_is_on_its_way_is_never_displaced(locker: RedisLocker) -> None:
    holder = attempt(locker, "a")
    assert isinstance(holder, Lease)
    attempt(locker, "b")
    locker.latest.release_latest(holder, reservation_ttl=30)  # reserved for b, its message sent
    c, d = attempt(locker, "c"), attempt(locker, "d")
    assert isinstance(c, Parked) and c.displaced == () and c.position == 2
    assert isinstance(d, Parked) and d.displaced == (b"c\nmsg",)
    assert isinstance(attempt(locker, "b"), Lease)
    assert waiting_ids(locker) == [b"d"]


def test_a_debounced_call_is_held_even_on_a_free_lock(locker: RedisLocker) -> None:
    held = attempt(locker, "a", Latest(debounce=5))
    assert isinstance(held, Parked) and held.holder is None
    assert locker.queue.hand_off_due().names == []  # not due for 5 s
    assert locker.client.exists(locker.keys("job").lock) == 0


def test_a_debounced_call_is_handed_on_by_the_sweeper_once_due(locker: RedisLocker) -> None:
    attempt(locker, "a", Latest(debounce=0.05))
    wait_until(
        lambda: locker.queue.hand_off_due().names == ["job"], timeout=5
    )  # by the server's clock
    assert locker.queue.hand_on("job", reservation_ttl=30) == [b"a\nmsg"]
    assert isinstance(attempt(locker, "a", Latest(debounce=0.05)), Lease)


def test_a_newer_call_restarts_the_debounce_but_not_past_its_bound(locker: RedisLocker) -> None:
    key = locker.keys("job").lock + ":latest"
    attempt(locker, "a", Latest(debounce=60, debounce_max=90))
    first = int(locker.client.hget(key, "first") or 0)
    time.sleep(0.05)  # a later call: its due time is later
    attempt(locker, "b", Latest(debounce=60, debounce_max=90))
    due = int(locker.client.hget(key, "due") or 0)
    assert int(locker.client.hget(key, "first") or 0) == first
    assert first + 60_000 < due <= first + 90_000
    bounded = attempt(locker, "c", Latest(debounce=60, debounce_max=60.01))
    assert isinstance(bounded, Parked)
    assert int(locker.client.hget(key, "due") or 0) == first + 60_010


def test_a_release_before_the_waiting_call_is_due_hands_nothing_on(locker: RedisLocker) -> None:
    holder = attempt(locker, "a")
    assert isinstance(holder, Lease)
    attempt(locker, "b", Latest(debounce=60))
    owned, handed = locker.latest.release_latest(holder, reservation_ttl=30)
    assert owned and handed is None
    assert waiting_ids(locker) == [b"b"]


def test_latest_without_a_parked_message_is_refused(locker: RedisLocker) -> None:
    with pytest.raises(ValueError, match="latest needs park"):
        locker.try_acquire("job", 30, owner=Owner(task_id="a"), latest=Latest())


def sent(locker: RedisLocker, task_id: str, micros: int) -> Union[Lease, LockHolder, Parked]:
    """An acquire of ``task_id`` sent at ``micros`` (its stamp)."""
    return attempt(locker, task_id, Latest(sent=f"{micros:016d}.1"))


def test_a_call_sent_before_the_waiting_one_is_superseded_and_does_not_displace_it(
    locker: RedisLocker,
) -> None:
    assert isinstance(sent(locker, "a", 100), Lease)
    assert isinstance(sent(locker, "c", 300), Parked)
    with pytest.raises(AlreadySuperseded):
        sent(locker, "b", 200)  # sent before c, got here after it
    assert waiting_ids(locker) == [b"c"]
    superseded = locker.keys("job").lock + ":superseded"
    assert locker.client.zscore(superseded, "b") is not None
    assert locker.client.hget(superseded + "-left", "b") == b"b\nmsg"  # as a displaced call
    later = sent(locker, "d", 400)  # sent after c: takes its place
    assert isinstance(later, Parked) and later.displaced == (b"c\nmsg",)
    assert waiting_ids(locker) == [b"d"]


def test_a_call_sent_before_the_holder_never_waits_or_runs_after_it(locker: RedisLocker) -> None:
    holder = sent(locker, "e", 500)
    assert isinstance(holder, Lease)
    with pytest.raises(AlreadySuperseded):
        sent(locker, "d", 400)  # reached the lock while the newer call runs
    locker.latest.release_latest(holder, reservation_ttl=30)
    with pytest.raises(AlreadySuperseded):
        sent(locker, "c", 300)  # and once it ran
    assert isinstance(sent(locker, "f", 600), Lease)


def test_the_reserved_call_takes_the_lock_even_if_a_newer_one_waits(locker: RedisLocker) -> None:
    holder = sent(locker, "a", 100)
    assert isinstance(holder, Lease)
    sent(locker, "b", 200)
    locker.latest.release_latest(holder, reservation_ttl=30)  # reserved for b, its message sent
    assert isinstance(sent(locker, "c", 300), Parked)  # behind b's reservation
    assert isinstance(sent(locker, "b", 200), Lease)
    assert waiting_ids(locker) == [b"c"]
