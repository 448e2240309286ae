"""Latest wins on one server: the calls a newer one displaced are recorded by the displacing
script itself (ACQUIRE_OR_REPLACE), left to mark until CLEAR_SUPERSEDED, and a stale copy of
one is refused."""

from __future__ import annotations

import pytest

from celery_singleton_lock.engine import Parked, RedisLocker
from celery_singleton_lock.engine.latest import MAX_SUPERSEDED, superseded_keys
from celery_singleton_lock.errors import AlreadySuperseded
from tests.engine.test_latest_wins import attempt, waiting_ids


def ids_of(locker: RedisLocker) -> set[bytes]:
    return set(
        locker.client.zrange(
            superseded_keys(locker.keys("job"), locker.shared.superseded)[0], 0, -1
        )
    )


def left_of(locker: RedisLocker) -> dict[bytes, bytes]:
    return dict(
        locker.client.hgetall(superseded_keys(locker.keys("job"), locker.shared.superseded)[1])
    )


def make_due(locker: RedisLocker) -> None:
    """As if the grace given to the displacing worker had passed (it died)."""
    locker.client.zadd(superseded_keys(locker.keys("job"), locker.shared.superseded)[2], {"job": 0})


def displace_b(locker: RedisLocker) -> None:
    attempt(locker, "a")
    attempt(locker, "b")
    attempt(locker, "c")


def test_the_displacing_acquire_records_the_displaced_task_id(locker: RedisLocker) -> None:
    displace_b(locker)
    assert ids_of(locker) == {b"b"}


def test_the_displacing_acquire_leaves_the_displaced_message_to_mark(
    locker: RedisLocker,
) -> None:
    displace_b(locker)
    assert left_of(locker) == {b"b": b"b\nmsg"}


def test_a_call_left_to_mark_is_not_due_for_a_sweeper_within_the_grace(
    locker: RedisLocker,
) -> None:
    displace_b(locker)
    assert locker.latest.superseded_left() == []


def test_a_call_left_to_mark_is_due_for_a_sweeper_after_the_grace(locker: RedisLocker) -> None:
    displace_b(locker)
    make_due(locker)
    assert locker.latest.superseded_left() == [("job", [b"b\nmsg"])]


def test_clearing_a_marked_call_leaves_nothing_for_a_sweeper(locker: RedisLocker) -> None:
    displace_b(locker)
    make_due(locker)
    assert locker.latest.clear_superseded("job", ["b"]) == 0
    assert locker.latest.superseded_left() == []


def test_a_cleared_call_stays_recorded_as_superseded(locker: RedisLocker) -> None:
    displace_b(locker)
    locker.latest.clear_superseded("job", ["b"])
    assert ids_of(locker) == {b"b"}


def test_a_call_still_left_after_a_clear_is_looked_at_again_later(locker: RedisLocker) -> None:
    displace_b(locker)
    make_due(locker)
    assert locker.latest.clear_superseded("job", [], look_again_in=60) == 1
    assert locker.latest.superseded_left() == []


def test_a_stale_copy_of_a_displaced_call_is_refused(locker: RedisLocker) -> None:
    displace_b(locker)
    with pytest.raises(AlreadySuperseded):
        attempt(locker, "b")


def test_a_stale_copy_of_a_displaced_call_does_not_displace_the_newer_call(
    locker: RedisLocker,
) -> None:
    displace_b(locker)
    with pytest.raises(AlreadySuperseded):
        attempt(locker, "b")
    assert waiting_ids(locker) == [b"c"]


def test_a_stale_copy_of_a_displaced_call_is_refused_on_a_free_lock(locker: RedisLocker) -> None:
    displace_b(locker)
    locker.client.delete(locker.keys("job").lock, locker.keys("job").parked)
    with pytest.raises(AlreadySuperseded):
        attempt(locker, "b")


def test_superseded_ids_are_bounded_per_lock(locker: RedisLocker) -> None:
    attempt(locker, "holder")
    for index in range(MAX_SUPERSEDED + 5):
        assert isinstance(attempt(locker, f"w{index}"), Parked)
    assert len(ids_of(locker)) == MAX_SUPERSEDED
