"""Run-time behaviour of a locked task on a real worker: cost, loss, reentrancy, eager, outage."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Iterator

import pytest
import redis
from celery import chain
from celery.signals import task_postrun

from celery_singleton_lock.celery import lock_lost
from celery_singleton_lock.engine import Lease, Owner, RedisLocker
from celery_singleton_lock.testing import RedisServer
from tests.celery.conftest import assert_released, lock_key_of
from tests.celery.tasks import expiry, policies, runtime
from tests.support import CountingConnection, wait_until


def test_an_uncontended_task_costs_exactly_two_lock_round_trips(
    worker: Any, unique_key: str
) -> None:
    policies.hold_skip.delay(f"{unique_key}-warm").get(timeout=10)  # scripts loaded once
    keyer = policies.hold_skip.lock_options.keyer
    names = [keyer.name((f"{unique_key}-{i}",), {}) for i in range(25)]
    CountingConnection.reset()
    for i in range(25):
        policies.hold_skip.delay(f"{unique_key}-{i}").get(timeout=10)
    # the last release is sent without waiting; each call's round trips are those naming its
    # lock (the shared worker may still release another test's lock meanwhile)
    wait_until(lambda: len(CountingConnection.about(names[-1])) >= 2, timeout=5)
    assert [CountingConnection.about(name) for name in names] == [["EVALSHA", "EVAL"]] * 25


def test_a_lost_lock_is_flagged_on_the_request_and_signalled(worker: Any, unique_key: str) -> None:
    seen: list[dict[str, Any]] = []

    def receiver(**kwargs: Any) -> None:
        seen.append(kwargs)

    lock_lost.connect(receiver, weak=False)
    try:
        result = runtime.watches_its_lock.delay(unique_key)
        assert result.get(timeout=10) == {"lost": True, "check_raised": "LockLostError"}
        # the renewer sets the flag first (the body may end at once), then signals
        wait_until(lambda: seen, timeout=5)
    finally:
        lock_lost.disconnect(receiver)
    assert [s["task_id"] for s in seen] == [result.id]


def test_a_nested_same_key_run_in_the_same_thread_is_reentrant(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    assert runtime.reentrant.delay(unique_key, 2).get(timeout=10) == [2, 1, 0]
    assert int(store.get(f"reentrant:{unique_key}")) == 3
    assert_released(store, lock_key_of(runtime.reentrant, unique_key, 0))


def test_fences_increase_across_executions(worker: Any) -> None:
    fences = [runtime.fenced.delay("acct-fence").get(timeout=10) for _ in range(5)]
    assert all(b > a for a, b in zip(fences, fences[1:]))


def test_apply_takes_a_real_lock_and_skips_when_it_is_held(
    celery_app: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    name = policies.hold_skip.lock_options.keyer.name((unique_key,), {})
    lease = locker.try_acquire(name, 30, owner=Owner(task_id="elsewhere"), renew=False)
    assert isinstance(lease, Lease)
    result = policies.hold_skip.apply(args=(unique_key,))
    assert result.state == "IGNORED"
    assert store.llen(f"runs:{unique_key}") == 0
    lease.release()
    assert policies.hold_skip.apply(args=(unique_key,)).get()["key"] == unique_key
    assert not store.exists(lease.key)


def test_always_eager_mode_takes_and_releases_real_locks(
    celery_app: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    celery_app.conf.task_always_eager = True
    try:
        fence = runtime.fenced.delay(unique_key).get()
    finally:
        celery_app.conf.task_always_eager = False
    name = runtime.fenced.lock_options.keyer.name((unique_key,), {})
    assert fence >= 1 and locker.inspect.fence(name) >= fence
    assert_released(store, lock_key_of(runtime.fenced, unique_key))


def test_a_direct_call_takes_no_lock(
    celery_app: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    name = policies.hold_skip.lock_options.keyer.name((unique_key,), {})
    lease = locker.try_acquire(name, 30, renew=False)
    assert isinstance(lease, Lease)
    policies.hold_skip(unique_key)  # runs in the caller: Celery runs no before_start here
    assert store.llen(f"runs:{unique_key}") == 1
    assert store.exists(lease.key)  # the holder's lock was neither taken nor released
    lease.release()


def test_unreachable_lock_server_retries_the_task_until_it_returns(
    worker: Any, lock_server: RedisServer, unique_key: str
) -> None:
    lock_server.stop()
    try:
        result = runtime.retries_on_outage.delay(unique_key)
        wait_until(lambda: result.state == "RETRY", timeout=20)
        time.sleep(0.5)
    finally:
        lock_server.start()
    assert result.get(timeout=30) == "ran"


def test_lock_on_backend_error_run_runs_without_the_lock(
    worker: Any, lock_server: RedisServer, unique_key: str
) -> None:
    lock_server.stop()
    try:
        result = runtime.runs_unlocked.delay(unique_key)
        assert result.get(timeout=20) is False
    finally:
        lock_server.start()


@pytest.mark.parametrize("value", [b"x" * (10 * 1024 * 1024), "é" * 3_000_000])
def test_huge_arguments_give_a_bounded_key(celery_app: Any, value: Any) -> None:
    key = lock_key_of(policies.hold_skip, value)
    assert len(key) < 200


def test_apply_with_retry_policy_waits_in_place_for_the_release(
    celery_app: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    name = policies.hold_retry.lock_options.keyer.name((unique_key,), {})
    lease = locker.try_acquire(name, 30, renew=False)
    assert isinstance(lease, Lease)
    releaser = threading.Timer(0.3, lease.release)
    releaser.start()
    try:
        result = policies.hold_retry.apply(args=(unique_key,))
    finally:
        releaser.join()
    assert result.state == "SUCCESS"
    assert store.llen(f"runs:{unique_key}") == 1


def test_apply_with_the_lock_server_down_fails_at_once_with_backend_unavailable(
    celery_app: Any, lock_server: RedisServer, unique_key: str
) -> None:
    lock_server.stop()
    try:
        started = time.monotonic()
        result = runtime.retries_on_outage.apply(args=(unique_key,))
        elapsed = time.monotonic() - started
    finally:
        lock_server.start()
    assert result.state == "FAILURE"
    assert type(result.result).__name__ == "LockBackendUnavailable"
    assert elapsed < 10


def test_same_key_chain_steps_do_not_collide(
    worker: Any,
    locker: RedisLocker,
    store: redis.Redis,
    unique_key: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A step releases before Celery publishes the next step, so the next same-key step finds
    # the lock free (it would be skipped otherwise). A slow release makes a release that did
    # not come first lose that race for certain.
    release = locker.release

    def slow_release(lease: Lease, **options: Any) -> bool:
        time.sleep(0.3)
        return release(lease, **options)

    monkeypatch.setattr(locker, "release", slow_release)
    steps = chain(*(policies.hold_skip.si(unique_key, 0.01) for _ in range(3)))
    steps.apply_async().get(timeout=20)
    assert store.llen(f"runs:{unique_key}") == 3


@contextlib.contextmanager
def ended_states() -> Iterator[dict[str, list[str]]]:
    """Task id -> the state each execution of it ended in, as ``task_postrun`` says it: None
    for one a worker dropped (ended quietly, before the tracer set a state: see
    ``celery_api.EndedQuietly``)."""
    ended: dict[str, list[str]] = {}

    def record(task_id: str = "", state: str = "", **_: Any) -> None:
        ended.setdefault(task_id, []).append(state)

    task_postrun.connect(record, weak=False)
    try:
        yield ended
    finally:
        task_postrun.disconnect(record)


def test_an_acks_late_task_id_that_finished_does_not_run_again_under_its_lock(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    task_id = str(uuid.uuid4())
    with ended_states() as ended:
        expiry.late_ack_retry.apply_async((unique_key, 0), task_id=task_id).get(timeout=10)
        expiry.late_ack_retry.apply_async((unique_key, 0), task_id=task_id)  # as a copy would
        wait_until(lambda: len(ended.get(task_id, [])) == 2)
    assert ended[task_id] == ["SUCCESS", None]
    assert store.llen(f"runs:{unique_key}") == 1
    assert_released(store, lock_key_of(expiry.late_ack_retry, unique_key))


def test_with_lock_finished_ttl_none_the_same_task_id_runs_again(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    task_id = str(uuid.uuid4())
    with ended_states() as ended:
        for _ in range(2):
            expiry.late_ack_forgetful.apply_async((unique_key,), task_id=task_id).get(timeout=10)
        wait_until(lambda: len(ended.get(task_id, [])) == 2)
    assert ended[task_id] == ["SUCCESS", "SUCCESS"]
    assert store.llen(f"runs:{unique_key}") == 2


def test_a_locked_task_with_track_started_is_started_while_its_body_runs(
    worker: Any, unique_key: str
) -> None:
    assert runtime.reports_its_state.lock_track_started
    assert not runtime.reports_its_state.track_started  # the tracer's own store is off
    assert runtime.reports_its_state.delay(unique_key).get(timeout=10) == "STARTED"


#: binds one task of the test app before configure() (as a test module's ``task.name`` at import
#: does) and one after; prints what each read at binding
_BOUND_EARLY_AND_LATE = """
from tests.celery.tasks import core, policies
early = policies.hold_retry
read_early = (early.lock_track_started, early.lock_options.priority_sign)
core.configure(broker_url="redis://127.0.0.1:1/1", backend_url="redis://127.0.0.1:1/2",
               lock_url="redis://127.0.0.1:1/3")
late = policies.hold_skip
print(read_early, (late.lock_track_started, late.lock_options.priority_sign))
"""


def test_a_task_bound_before_the_test_app_is_configured_reads_what_one_bound_after_reads() -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("CSL_", "CELERY_"))}
    done = subprocess.run(
        [sys.executable, "-c", _BOUND_EARLY_AND_LATE],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(True, -1) (True, -1)"


def test_apply_with_too_few_replicas_fails_with_backend_unavailable_and_leaves_no_lock(
    celery_app: Any, store: redis.Redis, unique_key: str
) -> None:
    result = runtime.needs_a_replica.apply(args=(unique_key,))
    assert result.state == "FAILURE"
    assert type(result.result).__name__ == "LockBackendUnavailable"
    assert "replica" in str(result.result)
    assert not store.exists(lock_key_of(runtime.needs_a_replica, unique_key))
