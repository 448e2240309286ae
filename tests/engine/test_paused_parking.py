"""Calls that wait while their task's live rule pauses it (engine/live_rules.py), on a real
Redis: latest wins (ACQUIRE_OR_REPLACE, policies ``replace`` and ``restart``) takes no lock
during a pause, not even one reserved for it, and the newest call is the one handed the lock
when the pause ends; a parked call of either kind says it waits for a pause."""

from __future__ import annotations

import time
from typing import Any, Union

import pytest
import redis

from celery_singleton_lock.engine import Latest, Lease, LockHolder, Owner, RedisLocker
from celery_singleton_lock.engine.lease import Parked
from celery_singleton_lock.errors import AlreadySuperseded

NAME = "proj.job:aa"  # a lock of family "proj.job"
RULE = "t:cap:proj.job"  # its live rule under the locker's prefix "t"


def take(locker: RedisLocker, task_id: str, **options: Any) -> Union[Lease, LockHolder, Parked]:
    """One acquire of ``NAME`` by ``task_id`` that parks its message ``<id>\nmsg`` when it
    cannot start, reading the family's live rule."""
    return locker.try_acquire(
        NAME,
        ttl=30,
        owner=Owner(task_id=task_id),
        renew=False,
        park=f"{task_id}\nmsg".encode(),
        cap_key=RULE,
        **options,
    )


def newest(locker: RedisLocker, task_id: str, **options: Any) -> Union[Lease, LockHolder, Parked]:
    """A latest-wins acquire (policies replace, restart)."""
    return take(locker, task_id, reservation_ttl=30, latest=Latest(), **options)


def queued(locker: RedisLocker, task_id: str) -> Union[Lease, LockHolder, Parked]:
    """An acquire of one of ``NAME``'s 2 slots (policy queue)."""
    return take(locker, task_id, limit=2)


def waiting_ids(locker: RedisLocker) -> list[bytes]:
    return list(locker.client.zrange(locker.keys(NAME).parked, 0, -1))


def test_a_paused_latest_call_waits_though_the_lock_is_free(locker: RedisLocker) -> None:
    locker.live_rules.pause("proj.job", 30)
    waiting = newest(locker, "a")
    assert isinstance(waiting, Parked) and waiting.paused and waiting.holder is None
    assert locker.client.exists(locker.keys(NAME).lock) == 0


def test_a_latest_call_without_a_pause_is_not_said_paused(locker: RedisLocker) -> None:
    assert isinstance(newest(locker, "a"), Lease)
    waiting = newest(locker, "b")
    assert isinstance(waiting, Parked) and not waiting.paused


def test_a_paused_latest_call_is_due_for_a_sweeper_when_the_pause_ends(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    end = locker.live_rules.pause("proj.job", 20)
    newest(locker, "a")
    due = redis_client.zscore("t:handoff-due", NAME)
    assert due is not None and abs(due / 1000.0 - end) < 0.05


def test_a_paused_latest_call_is_not_handed_the_lock_before_the_pause_ends(
    locker: RedisLocker,
) -> None:
    locker.live_rules.pause("proj.job", 30)
    newest(locker, "a")
    assert NAME not in locker.queue.hand_off_due().names


def test_a_call_handed_the_lock_during_a_pause_gives_its_reservation_up_and_waits(
    locker: RedisLocker,
) -> None:
    holder = newest(locker, "a")
    assert isinstance(holder, Lease)
    newest(locker, "b")
    locker.live_rules.pause("proj.job", 30)
    _, handed = locker.latest.release_latest(holder, reservation_ttl=30)  # reserved for b
    assert handed == b"b\nmsg"
    again = newest(locker, "b")  # its message delivered during the pause
    assert isinstance(again, Parked) and again.paused
    assert locker.client.exists(locker.keys(NAME).lock) == 0
    assert waiting_ids(locker) == [b"b"]


def test_a_reserved_call_with_a_newer_one_waiting_is_superseded_during_a_pause(
    locker: RedisLocker,
) -> None:
    holder = newest(locker, "a")
    assert isinstance(holder, Lease)
    newest(locker, "b")
    locker.latest.release_latest(holder, reservation_ttl=30)  # reserved for b
    newest(locker, "c")  # waits behind b's reservation
    locker.live_rules.pause("proj.job", 30)
    with pytest.raises(AlreadySuperseded):
        newest(locker, "b")
    assert waiting_ids(locker) == [b"c"]


def test_after_a_resume_the_newest_call_is_handed_the_lock(locker: RedisLocker) -> None:
    locker.live_rules.pause("proj.job", None)
    for task_id in "abc":
        newest(locker, task_id)
    locker.live_rules.resume("proj.job")
    assert NAME in locker.queue.hand_off_due().names
    assert locker.queue.hand_on(NAME, reservation_ttl=30) == [b"c\nmsg"]
    assert isinstance(newest(locker, "c"), Lease)


def test_a_resend_of_a_latest_lock_taken_before_the_pause_keeps_it(locker: RedisLocker) -> None:
    first = newest(locker, "a", token="0" * 32)
    locker.live_rules.pause("proj.job", 30)
    assert isinstance(first, Lease)
    assert isinstance(newest(locker, "a", token="0" * 32), Lease)


def test_a_queue_call_parked_by_a_pause_says_paused(locker: RedisLocker) -> None:
    locker.live_rules.pause("proj.job", 30)
    parked = queued(locker, "a")
    assert isinstance(parked, Parked) and parked.paused


def test_a_queue_call_parked_behind_taken_slots_is_not_said_paused(locker: RedisLocker) -> None:
    assert isinstance(queued(locker, "a"), Lease) and isinstance(queued(locker, "b"), Lease)
    parked = queued(locker, "c")
    assert isinstance(parked, Parked) and not parked.paused


def test_a_latest_call_parked_under_a_pause_is_not_handed_on_by_a_sweeper_during_it(
    locker: RedisLocker,
) -> None:
    """As after ``celery locks pause F --for 60`` given while F is paused until resumed: the
    parked calls are looked at once (a queue's hand nothing on)."""
    locker.live_rules.pause("proj.job", None)
    assert isinstance(newest(locker, "a"), Parked)
    locker.live_rules.pause("proj.job", 30)
    assert locker.queue.hand_on(NAME, reservation_ttl=30) == []


def test_a_pause_ended_by_itself_lets_the_latest_call_take_the_lock(locker: RedisLocker) -> None:
    locker.live_rules.pause("proj.job", 2)  # outlasts the call's parking certainly
    assert isinstance(newest(locker, "a"), Parked)
    deadline = time.monotonic() + 10
    while locker.live_rules.read("proj.job").paused_for is not None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert locker.queue.hand_on(NAME, reservation_ttl=30) == [b"a\nmsg"]
    assert isinstance(newest(locker, "a"), Lease)


def test_a_sweep_during_a_timed_pause_makes_the_latest_call_due_when_it_ends(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    locker.live_rules.pause("proj.job", None)
    newest(locker, "a")
    end = locker.live_rules.pause("proj.job", 30)  # the call is due now: a sweeper looks
    locker.queue.hand_on(NAME, reservation_ttl=5)  # a reservation would be due sooner
    due = redis_client.zscore("t:handoff-due", NAME)
    assert due is not None and abs(due / 1000.0 - end) < 0.05


def test_a_latest_call_under_a_pause_until_resumed_stays_parked_at_a_sweepers_look(
    locker: RedisLocker,
) -> None:
    locker.live_rules.pause("proj.job", None)
    newest(locker, "a")
    assert locker.queue.hand_on(NAME, reservation_ttl=30) == []
    assert waiting_ids(locker) == [b"a"]


def test_a_resume_does_not_hand_on_a_latest_call_before_its_debounce_is_due(
    locker: RedisLocker,
) -> None:
    locker.live_rules.pause("proj.job", None)
    take(locker, "a", reservation_ttl=30, latest=Latest(debounce=60))
    locker.live_rules.resume("proj.job")  # makes the lock due now
    assert locker.queue.hand_on(NAME, reservation_ttl=30) == []
