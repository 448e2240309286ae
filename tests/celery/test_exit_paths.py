"""Every way a body can end releases its lock (threads pool, in-process worker).

Time limits need the prefork pool: see test_prefork.py."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest
import redis

from celery_singleton_lock.celery import lock_released
from tests.celery.conftest import assert_released, lock_key_of
from tests.celery.tasks import exits, policies
from tests.support import wait_until


@contextlib.contextmanager
def releases_seen() -> Iterator[list[str]]:
    """The task ids whose lock_released signal fires while the block runs."""
    released: list[str] = []

    def receiver(task_id: str, **_: Any) -> None:
        released.append(task_id)

    lock_released.connect(receiver, weak=False)
    try:
        yield released
    finally:
        lock_released.disconnect(receiver)


def test_success_releases_the_lock(worker: Any, store: redis.Redis, unique_key: str) -> None:
    policies.hold_skip.delay(unique_key).get(timeout=10)
    assert_released(store, lock_key_of(policies.hold_skip, unique_key))


def test_failure_releases_the_lock(worker: Any, store: redis.Redis, unique_key: str) -> None:
    with pytest.raises(ValueError):
        exits.raises.delay(unique_key).get(timeout=10)
    assert_released(store, lock_key_of(exits.raises, unique_key))


def test_a_subclass_call_that_skips_super_still_releases_the_lock(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    assert exits.own_call.delay(unique_key).get(timeout=10) is True  # held in the body
    assert_released(store, lock_key_of(exits.own_call, unique_key))


def test_a_subclass_call_that_calls_super_holds_the_lock_until_it_returns(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    # [held in the body, held in the subclass's __call__ after super() returned]
    assert exits.own_call_super.delay(unique_key).get(timeout=10) == [True, True]
    assert_released(store, lock_key_of(exits.own_call_super, unique_key))


def test_a_base_before_lockedtask_whose_call_answers_early_leaves_the_lock_free(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    # class Cached(EarlyAnswer, LockedTask): the cache answers without calling run
    task = exits.answers_early
    assert task.delay(unique_key, cached=True).get(timeout=10) == "from the cache"
    assert_released(store, lock_key_of(task, unique_key))
    # the next call of that name takes the lock itself (not a leftover scope's)
    assert task.delay(unique_key).get(timeout=10) == {"held": True}
    assert_released(store, lock_key_of(task, unique_key))


def test_a_base_before_lockedtask_whose_call_answers_early_in_the_caller_thread(
    celery_app: Any, store: redis.Redis, unique_key: str
) -> None:
    # apply(): both calls run in this thread, where a leftover scope would be found
    task = exits.answers_early
    assert task.apply(args=(unique_key,), kwargs={"cached": True}).get() == "from the cache"
    assert not store.exists(lock_key_of(task, unique_key))
    assert task.apply(args=(unique_key,)).get() == {"held": True}
    assert not store.exists(lock_key_of(task, unique_key))


def test_a_locked_body_runs_without_celerys_task_call_and_its_request_copy(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    before = exits.CountsRequestPushes.pushes
    assert exits.counts_pushes.delay(unique_key).get(timeout=10) is True
    assert exits.CountsRequestPushes.pushes == before
    assert_released(store, lock_key_of(exits.counts_pushes, unique_key))


def test_self_retry_releases_before_the_next_attempt_which_runs(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    # countdown=0: the next attempt starts at once and would be skipped as a duplicate of
    # its own previous attempt if the lock were still held.
    assert exits.retries_once.delay(unique_key).get(timeout=10) == "second attempt"
    assert_released(store, lock_key_of(exits.retries_once, unique_key))


def test_autoretry_releases_and_the_next_attempt_runs(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    assert exits.autoretries.delay(unique_key).get(timeout=10) == "second attempt"
    assert_released(store, lock_key_of(exits.autoretries, unique_key))


def test_ignore_raised_by_the_body_releases_the_lock(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    with releases_seen() as released:
        result = exits.ignores.delay(unique_key)
        wait_until(lambda: result.id in released, timeout=10)  # IGNORED stores no state
    assert_released(store, lock_key_of(exits.ignores, unique_key))


def test_reject_raised_by_the_body_releases_the_lock(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    with releases_seen() as released:
        result = exits.rejects.delay(unique_key)
        # Celery < 5.7 stores no state for a message rejected without requeue (5.7: FAILURE)
        wait_until(lambda: result.id in released, timeout=10)
    assert_released(store, lock_key_of(exits.rejects, unique_key))


def test_unsupported_argument_fails_naming_task_and_argument_and_takes_no_lock(
    worker: Any, store: redis.Redis
) -> None:
    before = set(store.scan_iter(match="singleton-lock:*"))
    # apply(): a set would not survive the JSON serializer on its way to a worker
    result = exits.takes_anything.apply(args=({1, 2},))
    with pytest.raises(Exception) as info:
        result.get()
    assert type(info.value).__name__ == "UnsupportedArgumentError"
    message = str(info.value)
    assert "tests.celery.tasks.exits.takes_anything" in message
    assert "value" in message and "set" in message and "lock_on" in message
    assert set(store.scan_iter(match="singleton-lock:*")) == before


def test_a_worker_release_is_signalled_once_even_with_no_task_after_it(
    worker: Any, unique_key: str
) -> None:
    """The release is sent without waiting; its reply is read by the renewer when no other
    command follows it on that connection, and reported then."""
    with releases_seen() as released:
        result = policies.hold_skip.delay(unique_key)
        result.get(timeout=10)
        wait_until(lambda: result.id in released, timeout=5)
    assert released.count(result.id) == 1
