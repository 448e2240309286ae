"""The cancel flags of policy ``restart``: CANCEL_HOLDER flags the running holder's task id,
and the reads say which calls were asked to stop."""

from __future__ import annotations

from typing import Iterator

import pytest
import redis

from celery_singleton_lock.engine import Lease, Owner, RedisLocker
from celery_singleton_lock.engine.kinds.cancels import Cancels, cancel_channel
from tests.support import wait_until


@pytest.fixture
def flags(locker: RedisLocker) -> Iterator[Cancels]:
    assert locker.cancels is not None  # one server: latest wins, and restart beside it
    yield locker.cancels
    locker.cancels.close()  # this process's listener ends


def hold(locker: RedisLocker, name: str, task_id: str) -> Lease:
    lease = locker.try_acquire(name, ttl=30, owner=Owner(task_id=task_id), renew=False)
    assert isinstance(lease, Lease)
    return lease


def test_a_newer_call_flags_the_running_holder(locker: RedisLocker, flags: Cancels) -> None:
    hold(locker, "job", "v1")
    assert flags.cancel_holder("job", by="v2") == "v1"
    assert flags.cancel_requested([("job", "v1"), ("job", "v2")]) == [True, False]


def test_a_free_lock_flags_no_one(
    locker: RedisLocker, flags: Cancels, redis_client: redis.Redis
) -> None:
    assert flags.cancel_holder("job", by="v2") is None
    assert redis_client.keys("*cancel*") == []


def test_a_call_never_flags_itself(locker: RedisLocker, flags: Cancels) -> None:
    hold(locker, "job", "v2")
    assert flags.cancel_holder("job", by="v2") is None
    assert flags.cancel_requested([("job", "v2")]) == [False]


def test_a_reserved_lock_flags_no_one(
    locker: RedisLocker, flags: Cancels, redis_client: redis.Redis
) -> None:
    # a lock reserved for a waiting call: its token is not an owner's, no body runs
    key = locker.keys("job").lock
    redis_client.set(key, "handoff-reserved-for-next-parked||1|0||v2", px=30_000)
    assert flags.cancel_holder("job", by="v3") is None


def test_a_flag_asks_only_the_call_it_names(locker: RedisLocker, flags: Cancels) -> None:
    lease = hold(locker, "job", "v1")
    flags.cancel_holder("job", by="v2")
    lease.release()
    hold(locker, "job", "v2")  # the newer call runs now: it was not asked to stop
    assert flags.cancel_requested([("job", "v2"), ("other", "v1")]) == [False, False]
    assert flags.cancel_requested([]) == []


# -- the stop pushed to the process that runs the call (engine/cancel_watch.py) ----------------


def subscribed(redis_client: redis.Redis, locker: RedisLocker, name: str) -> bool:
    channel = cancel_channel(locker.keys(name))
    return bool(dict(redis_client.pubsub_numsub(channel)).get(channel.encode()))


def test_a_watched_call_is_told_by_the_message_not_by_a_read(
    locker: RedisLocker, flags: Cancels, redis_client: redis.Redis
) -> None:
    hold(locker, "job", "v1")
    signal = flags.watch("job", "v1")
    watch = flags.watching
    assert watch is not None
    wait_until(lambda: watch.confirmed == 1)  # the read after it found nothing
    assert not signal.asked
    flags.cancel_holder("job", by="v2")
    wait_until(lambda: signal.asked)
    assert (watch.pushed, watch.read) == (1, 0)


def test_a_stop_asked_before_the_subscription_is_found_by_the_read_after_it(
    locker: RedisLocker, flags: Cancels
) -> None:
    hold(locker, "job", "v1")
    flags.cancel_holder("job", by="v2")
    signal = flags.watch("job", "v1")
    wait_until(lambda: signal.asked)
    watch = flags.watching
    assert watch is not None and (watch.pushed, watch.read) == (0, 1)


def test_only_the_call_asked_is_told(
    locker: RedisLocker, flags: Cancels, redis_client: redis.Redis
) -> None:
    hold(locker, "job", "v1")
    other = flags.watch("job", "v0")  # an older call of the same lock, in this process
    signal = flags.watch("job", "v1")
    watch = flags.watching
    assert watch is not None
    wait_until(lambda: watch.confirmed == 1)
    flags.cancel_holder("job", by="v2")
    wait_until(lambda: signal.asked)
    assert not other.asked


def test_a_call_no_longer_watched_leaves_the_channel(
    locker: RedisLocker, flags: Cancels, redis_client: redis.Redis
) -> None:
    signal = flags.watch("job", "v1")
    wait_until(lambda: subscribed(redis_client, locker, "job"))
    flags.unwatch(signal)
    wait_until(lambda: not subscribed(redis_client, locker, "job"))
    watch = flags.watching
    assert watch is not None and watch.watched() == 0


def test_a_stop_asked_while_the_connection_was_down_is_read_after_it_comes_back(
    locker: RedisLocker, flags: Cancels, redis_client: redis.Redis
) -> None:
    hold(locker, "job", "v1")
    signal = flags.watch("job", "v1")
    wait_until(lambda: subscribed(redis_client, locker, "job"))
    assert redis_client.client_kill_filter(_type="pubsub") == 1
    flags.cancel_holder("job", by="v2")  # published to no one: the listener is gone
    wait_until(lambda: signal.asked)
    watch = flags.watching
    assert watch is not None and watch.pushed + watch.read == 1
