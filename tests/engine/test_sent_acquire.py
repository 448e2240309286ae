"""The mutex acquire in two steps: sent now, its reply read later on the connection it went on,
with the same outcome as the one-step acquire; abandoned, it releases what it took."""

from __future__ import annotations

import redis

from celery_singleton_lock.engine import (
    AcquireRequest,
    Lease,
    LockHolder,
    Owner,
    RedisLocker,
    Renewer,
)
from tests.support import CountingConnection


def request(name: str = "job", task_id: str = "t-1", **fields: object) -> AcquireRequest:
    return AcquireRequest(name, 30, owner=Owner(task_id=task_id), renew=False, **fields)  # type: ignore[arg-type]


def make_locker(client: redis.Redis) -> RedisLocker:
    return RedisLocker(client, prefix="t", renewer=Renewer(autostart=False))


def test_a_sent_acquire_read_later_holds_the_lock(redis_client: redis.Redis) -> None:
    locker = make_locker(redis_client)
    sent = locker.send_acquire(request())
    assert sent is not None
    lease = locker.acquired(sent)
    assert isinstance(lease, Lease)
    assert redis_client.get(locker.keys("job").lock)[:32] == lease.token.encode()  # type: ignore[index]


def test_a_sent_acquire_of_a_held_lock_reports_its_holder(redis_client: redis.Redis) -> None:
    locker = make_locker(redis_client)
    assert isinstance(locker.acquire(request(task_id="first")), Lease)
    sent = locker.send_acquire(request(task_id="second"))
    assert sent is not None
    holder = locker.acquired(sent)
    assert isinstance(holder, LockHolder) and holder.task_id == "first"


def test_an_abandoned_sent_acquire_releases_what_it_took(redis_client: redis.Redis) -> None:
    locker = make_locker(redis_client)
    sent = locker.send_acquire(request())
    assert sent is not None
    locker.abandon(sent)
    assert redis_client.exists(locker.keys("job").lock) == 0


def test_a_sent_acquire_costs_the_one_round_trip_of_an_acquire(
    counting_client: redis.Redis,
) -> None:
    locker = make_locker(counting_client)
    locker.acquire(request("warm-up"))  # loads the script once
    CountingConnection.reset()
    sent = locker.send_acquire(request())
    assert sent is not None
    assert isinstance(locker.acquired(sent), Lease)
    assert CountingConnection.sent == ["EVALSHA"]


def test_a_sent_acquire_after_a_script_flush_loads_the_script_and_takes_the_lock(
    redis_client: redis.Redis,
) -> None:
    locker = make_locker(redis_client)
    redis_client.script_flush()
    sent = locker.send_acquire(request())
    assert sent is not None
    assert isinstance(locker.acquired(sent), Lease)


def test_a_request_the_two_steps_do_not_cover_is_not_sent(redis_client: redis.Redis) -> None:
    locker = make_locker(redis_client)
    assert locker.send_acquire(request(limit=3)) is None
    assert locker.send_acquire(request(park=b"message")) is None
    assert locker.send_acquire(request(min_replicas=1)) is None


def test_the_connection_of_a_sent_acquire_is_not_lent_until_its_reply_is_read(
    redis_client: redis.Redis,
) -> None:
    locker = make_locker(redis_client)
    assert isinstance(locker.acquire(request("warm-up")), Lease)  # one idle kept connection
    sent = locker.send_acquire(request())
    assert sent is not None
    assert isinstance(locker.acquire(request("other")), Lease)  # takes another connection
    assert isinstance(locker.acquired(sent), Lease)
