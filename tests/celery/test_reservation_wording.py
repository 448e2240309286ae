"""A lock a release handed to a parked call (``on_duplicate="queue"``) is said to be reserved for
that call, not "held by task ... on ? pid 0": no process holds a hand-off reservation."""

from __future__ import annotations

from typing import Union

from celery_singleton_lock.celery.cli.lock_listing import describe_holder
from celery_singleton_lock.celery.duplicates.actions import describe, holding
from celery_singleton_lock.engine import Lease, LockHolder, Owner, RedisLocker
from celery_singleton_lock.engine.lease import Parked
from celery_singleton_lock.testing import RedisServer


def attempt(locker: RedisLocker, task_id: str) -> Union[Lease, LockHolder, Parked]:
    return locker.try_acquire(
        "job",
        ttl=30,
        owner=Owner(task_id=task_id, host="w1@h", pid=42),
        renew=False,
        park=f"msg-{task_id}".encode(),
        reservation_ttl=30,
    )


def reservation(redis_server: RedisServer) -> LockHolder:
    """The holder a third call finds once the first's release reserved the lock for the
    second."""
    locker = RedisLocker(redis_server.client(), prefix="wording")
    try:
        first = attempt(locker, "first")
        assert isinstance(first, Lease)
        assert isinstance(attempt(locker, "second"), Parked)
        assert locker.queue is not None
        handed = locker.queue.release_handing_on(first, limit=1, reservation_ttl=30)[1]
        assert handed == [b"msg-second"]
        third = attempt(locker, "third")
        assert isinstance(third, Parked) and third.holder is not None
        return third.holder
    finally:
        locker.close()


def test_a_reservation_is_said_reserved_for_the_parked_call(redis_server: RedisServer) -> None:
    said = holding(reservation(redis_server))
    assert said.startswith("reserved for parked call second")
    assert "pid" not in said and "?" not in said


def test_a_reservation_is_held_by_no_one_yet(redis_server: RedisServer) -> None:
    assert describe(reservation(redis_server)).startswith(
        "no one yet: it is reserved for parked call second"
    )


def test_the_cli_names_the_parked_call_a_lock_is_reserved_for(redis_server: RedisServer) -> None:
    assert describe_holder(reservation(redis_server)) == (
        "no one yet: reserved for parked call second"
    )


def test_a_running_holder_is_still_held_by_its_task(redis_server: RedisServer) -> None:
    locker = RedisLocker(redis_server.client(), prefix="wording")
    try:
        attempt(locker, "first")
        second = attempt(locker, "second")
        assert isinstance(second, Parked) and second.holder is not None
        assert holding(second.holder).startswith("held by task first on w1@h pid 42")
    finally:
        locker.close()
