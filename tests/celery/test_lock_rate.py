"""``lock_rate``: at most N body starts per key in any sliding window, on a real worker
(threads pool, in this process so the lock signals reach the test)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional

import pytest
import redis
from celery.signals import before_task_publish

from celery_singleton_lock import DuplicateTaskSkipped, LockConfigurationError
from celery_singleton_lock.celery import lock_duplicate
from celery_singleton_lock.celery.duplicates.redelivery import BACKOFF_HEADER, RETRY_HEADER
from celery_singleton_lock.engine import Lease, Owner, RedisLocker
from celery_singleton_lock.testing import RedisServer
from tests.celery.registration import register
from tests.celery.tasks import limits
from tests.support import wait_until

#: seconds the workers' clock may read a start early against the lock server's clock
CLOCKS = 0.1


def starts(store: redis.Redis, key: str) -> list[float]:
    return sorted(float(raw.split(b"|")[2]) for raw in store.lrange(f"runs:{key}", 0, -1))


@dataclass
class RateRun:
    """9 calls of ``rate3_retry`` (3 per 3 s) on one key, sent at once and all ended."""

    sent: list[str]  # their task ids
    starts: list[float]  # when each body started, in order
    rate_retries: int  # lock_duplicate signals with reason "rate" of these calls


@pytest.fixture(scope="module")
def rate_3_per_3s(worker: Any, lock_server: RedisServer) -> RateRun:
    """One run shared by the tests below (each takes seconds: the rate spaces the calls)."""
    key = f"k-{uuid.uuid4().hex[:12]}"
    seen: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        seen.append(kwargs)

    lock_duplicate.connect(receiver, weak=False)
    try:
        results = [limits.rate3_retry.delay(key) for _ in range(9)]
        for result in results:
            result.get(timeout=60)
    finally:
        lock_duplicate.disconnect(receiver)
    sent = [result.id for result in results]
    rate_retries = sum(1 for s in seen if s["task_id"] in sent and s["reason"] == "rate")
    store = lock_server.client()
    try:
        return RateRun(sent, starts(store, key), rate_retries)
    finally:
        store.close()


def test_rate_3_per_3s_with_retry_runs_all_9_calls_sent_at_once(rate_3_per_3s: RateRun) -> None:
    assert len(rate_3_per_3s.starts) == 9


def test_rate_3_per_3s_never_starts_more_than_3_in_any_3s_window(rate_3_per_3s: RateRun) -> None:
    times = rate_3_per_3s.starts
    assert all(later - first >= 3.0 - CLOCKS for first, later in zip(times, times[3:]))


def test_rate_retries_are_sent_for_when_the_window_allows_not_polled(
    rate_3_per_3s: RateRun,
) -> None:
    print(f"9 calls at 3/3s: {rate_3_per_3s.rate_retries} rate retries")
    # 6 calls wait one window and 3 of them a second: 9 when every retry lands on time
    assert rate_3_per_3s.rate_retries <= 12


def test_9_retry_calls_at_3_per_10s_all_run_within_25s_retried_about_once_each(
    worker: Any, store: redis.Redis, unique_key: str, duplicates_seen: list[dict[str, Any]]
) -> None:
    # issue 30 item 6: every refused call woke at the same instant and the losers' backoff
    # grew with each refusal: ~5.4 lock retries per call, and the last start sometimes > 40 s
    sent = time.time()
    for result in [limits.rate3_per_10s_retry.delay(unique_key) for _ in range(9)]:
        result.get(timeout=60)
    times = starts(store, unique_key)
    retries = [seen for seen in duplicates_seen if seen["action"] == "retry"]
    print(f"9 calls at 3/10s: last start {times[-1] - sent:.2f}s, {len(retries)} lock retries")
    assert len(times) == 9
    assert times[-1] - sent <= 25.0
    # 6 calls wait one window and 3 of them a second (9); the calls that come back while a
    # body runs add a few (12 to 18 here, 21 to 30 before; issue 30 counted ~5.4 per call)
    assert len(retries) <= 27


def test_a_retry_for_the_rates_next_start_does_not_grow_the_backoff(
    worker: Any, locker: RedisLocker, unique_key: str
) -> None:
    # A refusal that said when to come back is no failed poll: when the call then finds a body
    # running, its backoff starts from the first step (issue 30 item 6: it grew with every
    # rate refusal, and the calls' last starts slipped past 40 s)
    task = limits.rate3_per_10s_retry
    for _ in range(3):
        task.delay(unique_key).get(timeout=30)  # the window is full for ~10 s
    backoffs: list[Any] = []

    def record(headers: Optional[dict[str, Any]] = None, **_: Any) -> None:
        if headers and headers.get("id") == call_id and headers.get(RETRY_HEADER):
            backoffs.append(headers.get(BACKOFF_HEADER))

    call_id = str(uuid.uuid4())
    before_task_publish.connect(record, weak=False)
    try:
        result = task.apply_async((unique_key,), task_id=call_id)
        wait_until(lambda: backoffs, timeout=10)  # refused by the rate: sent for its next start
        name = task.lock_options.keyer.name((unique_key,), {})
        holder = Owner(task_id="holder")  # in the task's slot table, as its calls' locks are
        lease = locker.try_acquire(name, 30, owner=holder, renew=False, slotted=True)
        assert isinstance(lease, Lease)  # a body running when the call comes back
        try:
            wait_until(lambda: len(backoffs) >= 2, timeout=20)
        finally:
            lease.release()
        result.get(timeout=30)
    finally:
        before_task_publish.disconnect(record)
    assert backoffs[:2] == [0, 1]


def test_a_call_over_the_rate_is_skipped_saying_the_reason_is_the_rate(
    worker: Any, store: redis.Redis, unique_key: str, duplicates_seen: list[dict[str, Any]]
) -> None:
    for _ in range(2):
        limits.rate2_skip.delay(unique_key).get(timeout=30)
    with pytest.raises(DuplicateTaskSkipped, match="lock_rate"):
        limits.rate2_skip.delay(unique_key).get(timeout=30)
    assert [seen["reason"] for seen in duplicates_seen] == ["rate"]
    assert len(starts(store, unique_key)) == 2


@pytest.mark.parametrize("bad", ["3", "0/m", "3/x", "3/", 3, "a/m", "3/0s"])
def test_an_unparsable_rate_is_refused(registration_app: Any, bad: Any) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job: lock_rate=.* is not a rate"):
        register(registration_app, lock_rate=bad)


@pytest.mark.parametrize(
    ("rate", "seconds"), [("3/m", 60.0), ("10/30s", 30.0), ("5/h", 3600.0), ("2/0.5", 0.5)]
)
def test_a_rate_registers_as_starts_per_seconds(
    registration_app: Any, rate: str, seconds: float
) -> None:
    assert register(registration_app, lock_rate=rate).lock_options.rate[1] == seconds


@pytest.mark.parametrize("policy", ["join", "replace"])
def test_a_rate_with_a_policy_waiting_for_a_release_is_refused(
    registration_app: Any, policy: str
) -> None:
    with pytest.raises(LockConfigurationError, match=rf"lock_rate='3/m' .*'{policy}'"):
        register(registration_app, lock_rate="3/m", on_duplicate=policy)


def test_a_rate_is_refused_on_a_quorum(registration_app: Any) -> None:
    registration_app.conf.singleton_lock_url = [f"redis://127.0.0.1:{port}/0" for port in (1, 2, 3)]
    with pytest.raises(LockConfigurationError, match=r"lock_rate='3/m'.*Redlock quorum"):
        register(registration_app, lock_rate="3/m")
