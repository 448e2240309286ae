"""``lock_rate``: at most N acquisitions per key in any sliding window (engine/slots.py)."""

from __future__ import annotations

import time

import pytest
import redis

from celery_singleton_lock.engine import Lease, LockHolder, QuorumLocker, RedisLocker, Renewer
from celery_singleton_lock.errors import LockConfigurationError


def cycle(locker: RedisLocker, rate: tuple[int, float], limit: int = 1) -> object:
    outcome = locker.try_acquire("job", 10.0, rate=rate, limit=limit, renew=False)
    if isinstance(outcome, Lease):
        outcome.release()
    return outcome


def test_three_starts_per_window_are_taken_and_the_fourth_refused(locker: RedisLocker) -> None:
    outcomes = [cycle(locker, (3, 60.0)) for _ in range(4)]
    assert [type(outcome) for outcome in outcomes] == [Lease, Lease, Lease, LockHolder]


def test_over_the_rate_says_so_with_the_wait_as_its_ttl(locker: RedisLocker) -> None:
    for _ in range(2):
        cycle(locker, (2, 60.0))
    refused = cycle(locker, (2, 60.0))
    assert isinstance(refused, LockHolder) and refused.over_rate
    assert refused.ttl is not None and 55.0 < refused.ttl <= 60.0


def test_a_start_is_allowed_again_once_the_window_has_slid(locker: RedisLocker) -> None:
    assert isinstance(cycle(locker, (1, 0.2)), Lease)
    refused = cycle(locker, (1, 0.2))
    assert isinstance(refused, LockHolder) and refused.ttl is not None
    time.sleep(refused.ttl + 0.05)  # the wait the server named: nothing else to wait on
    assert isinstance(cycle(locker, (1, 0.2)), Lease)


def test_a_held_lock_is_reported_held_not_over_the_rate(locker: RedisLocker) -> None:
    lease = locker.try_acquire("job", 10.0, rate=(5, 60.0), renew=False)
    assert isinstance(lease, Lease)
    holder = locker.try_acquire("job", 10.0, rate=(5, 60.0))
    assert isinstance(holder, LockHolder) and not holder.over_rate


def test_a_rate_is_refused_on_a_quorum() -> None:
    clients = [redis.Redis(port=port) for port in (1, 2, 3)]  # never contacted
    quorum = QuorumLocker(clients, renewer=Renewer(autostart=False))
    with pytest.raises(LockConfigurationError, match="lock_rate"):
        quorum.try_acquire("job", 10.0, rate=(3, 1.0))
