"""A release sent without waiting: its reply read later on the same kept connection, and
reported then exactly as a waited release reports it."""

from __future__ import annotations

import time
from typing import Optional

import pytest
import redis

from celery_singleton_lock.engine import Lease, Owner, RedisLocker, Renewer
from celery_singleton_lock.engine.renewer import SETTLE_WITHIN
from celery_singleton_lock.errors import AlreadyFinished, LockError
from tests.support import CountingConnection, wait_until

Reports = list[tuple[Optional[bool], Optional[LockError]]]


def held(locker: RedisLocker, name: str = "job", **kwargs: object) -> Lease:
    lease = locker.try_acquire(name, 30, renew=False, **kwargs)  # type: ignore[arg-type]
    assert isinstance(lease, Lease)
    return lease


def release_later(locker: RedisLocker, lease: Lease, **kwargs: object) -> Reports:
    reports: Reports = []
    assert locker.release_later(
        lease,
        lambda owned, error: reports.append((owned, error)),
        **kwargs,  # type: ignore[arg-type]
    )
    return reports


def test_a_deferred_release_is_reported_when_the_next_command_reads_its_reply(
    redis_client: redis.Redis,
) -> None:
    locker = RedisLocker(redis_client, prefix="t", renewer=Renewer(autostart=False))
    reports = release_later(locker, held(locker))
    assert reports == []  # sent, not read
    held(locker, "next")
    assert reports == [(True, None)]


def test_a_deferred_release_frees_the_lock_for_another_owner(redis_client: redis.Redis) -> None:
    locker = RedisLocker(redis_client, prefix="t", renewer=Renewer(autostart=False))
    release_later(locker, held(locker))
    other = RedisLocker(redis.Redis(port=redis_client.connection_pool.connection_kwargs["port"]))
    assert isinstance(other.try_acquire("job", 30, renew=False), Lease)


def test_a_deferred_release_of_a_lock_no_longer_ours_reports_it(
    redis_client: redis.Redis,
) -> None:
    locker = RedisLocker(redis_client, prefix="t", renewer=Renewer(autostart=False))
    lease = held(locker)
    redis_client.delete(lease.key)  # it expired, say
    reports = release_later(locker, lease)
    locker.settle()
    assert reports == [(False, None)]


def test_the_renewer_reads_a_deferred_release_of_an_idle_process(
    redis_client: redis.Redis,
) -> None:
    locker = RedisLocker(redis_client, prefix="t", renewer=Renewer())
    reports = release_later(locker, held(locker))
    wait_until(lambda: reports == [(True, None)], timeout=5)


def test_an_idle_process_reads_its_deferred_release_within_half_a_second(
    redis_client: redis.Redis,
) -> None:
    # an idle worker's lock_released (sent when the reply is read) came a second late
    locker = RedisLocker(redis_client, prefix="t", renewer=Renewer())
    warm = release_later(locker, held(locker, "warm"))  # the thread started, now asleep
    wait_until(lambda: warm, timeout=5)
    lease = held(locker)
    sent = time.monotonic()
    reports = release_later(locker, lease)
    wait_until(lambda: reports, timeout=5, interval=0.005)
    assert reports == [(True, None)] and time.monotonic() - sent < 0.5


def test_a_look_reads_only_a_reply_owed_since_the_previous_look(
    redis_client: redis.Redis,
) -> None:
    # The renewer cannot tell a reply the next acquire is about to read from one nobody will
    # read until it has stayed owed from one look to the next: a busy worker's are left to
    # its acquires (read on the hot path's connection, as before).
    renewer = Renewer(autostart=False)
    locker = RedisLocker(redis_client, prefix="t", renewer=renewer)
    first = release_later(locker, held(locker, "one"))
    second = release_later(locker, held(locker, "two"))  # its acquire read the first reply
    renewer.run_once()
    assert first == [(True, None)] and second == []
    renewer.run_once()
    assert second == [(True, None)]


def test_a_deferred_release_after_a_script_flush_loads_the_script_and_releases(
    redis_client: redis.Redis,
) -> None:
    locker = RedisLocker(redis_client, prefix="t", renewer=Renewer(autostart=False))
    lease = held(locker)
    redis_client.script_flush()
    reports = release_later(locker, lease)
    locker.settle()
    assert reports == [(True, None)] and not redis_client.exists(lease.key)


def test_a_deferred_release_records_the_finish_for_the_next_acquire(
    redis_client: redis.Redis,
) -> None:
    locker = RedisLocker(redis_client, prefix="t", renewer=Renewer(autostart=False))
    owner = Owner(task_id="t-1")
    release_later(locker, held(locker, owner=owner), remember_for=60)
    with pytest.raises(AlreadyFinished):
        locker.try_acquire("job", 30, owner=owner, unless_finished=True, finished_ttl=60)


def test_an_uncontended_acquire_and_deferred_release_send_two_commands(
    counting_client: redis.Redis,
) -> None:
    locker = RedisLocker(counting_client, prefix="t", renewer=Renewer(autostart=False))
    release_later(locker, held(locker, "warm"))
    held(locker, "warm-2").release()  # scripts loaded, replies read
    CountingConnection.reset()
    reports = release_later(locker, held(locker))
    held(locker, "after")
    assert CountingConnection.sent == ["EVALSHA", "EVAL", "EVALSHA"]  # acquire, release, next
    assert reports == [(True, None)]


def test_a_busy_process_wakes_its_renewer_about_once_per_settle_period_not_per_release(
    redis_client: redis.Redis,
) -> None:
    # Each deferred release asks for a settle within SETTLE_WITHIN; the renewer thread must
    # not tick at each of those requests (it ticked once per task in a busy worker), nor be
    # woken at each. Both counts grow with the time the loop took (a loaded machine makes it
    # slower, so more settle periods pass), never with the releases: at most one tick per
    # settle period, and at most two wake-ups per tick (a lease added while a tick runs finds
    # no tick planned; a release after a look that found the process quiet is watched anew).
    # Woken per release would be one wake-up (or tick) per release: 300 here, against the
    # loop's few settle periods (~4 on a loaded 2-core machine).
    releases = 300
    renewer = Renewer()
    locker = RedisLocker(redis_client, prefix="t", renewer=renewer)
    held(locker, "warm").release()
    started, ticks, wakeups = time.monotonic(), renewer.ticks, renewer.wakeups
    reports: Reports = []
    for index in range(releases):
        lease = locker.try_acquire(f"job-{index}", 30)  # renewed: held by the renewer too
        assert isinstance(lease, Lease)
        assert locker.release_later(lease, lambda owned, error: reports.append((owned, error)))
    ticked, woken = renewer.ticks - ticks, renewer.wakeups - wakeups
    periods = (time.monotonic() - started) / SETTLE_WITHIN  # read after the counts: bounds them
    locker.settle()
    assert reports == [(True, None)] * releases
    # below a quarter of the releases, even two wake-ups per tick stay well under one per
    # release (measured: ~4 periods, the loop ~15x faster than this needs)
    assert periods < releases / 4, "too slow to tell a wake-up per release from one per period"
    assert ticked <= periods + 2
    assert woken <= 2 * ticked + 2
