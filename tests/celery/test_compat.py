"""celery_singleton_lock.compat: the behaviours celery-once's and celery-singleton's READMEs
document, on the suite's in-process worker. The same scenarios run beside the original packages
in test_compat_side_by_side.py."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import redis
from celery import states
from celery.result import EagerResult

from celery_singleton_lock import LockError
from celery_singleton_lock.compat import AlreadyQueued, DuplicateTaskError
from tests.celery.tasks import compat, core
from tests.celery.test_enqueue_dedupe import (
    assert_a_call_after_the_end_is_published,
    assert_a_queued_call_blocks_for,
    published,
    runs,
)
from tests.support import wait_until

# -- celery-once: QueueOnce -------------------------------------------------------------------


def test_once_a_second_delay_raises_already_queued_and_publishes_nothing(
    worker: Any, unique_key: str
) -> None:
    with published(compat.once_on_key) as ids:
        first = compat.once_on_key.delay(unique_key)
        with pytest.raises(AlreadyQueued) as raised:
            compat.once_on_key.delay(unique_key)
    core.open_gate(unique_key)
    assert ids == [first.id]
    assert isinstance(raised.value, LockError)
    assert 0 < raised.value.countdown <= 3600
    assert raised.value.holder == {"task_id": first.id}
    assert first.get(timeout=20) == first.id


def test_once_apply_async_raises_already_queued_too(worker: Any, unique_key: str) -> None:
    first = compat.once_on_key.apply_async(args=(unique_key,))
    with pytest.raises(AlreadyQueued):
        compat.once_on_key.apply_async(args=(unique_key,))
    core.open_gate(unique_key)
    first.get(timeout=20)


def test_once_a_call_while_the_task_runs_raises_already_queued(
    worker: Any, unique_key: str
) -> None:
    first = compat.once_on_key.delay(unique_key)
    wait_until(lambda: runs(unique_key))
    with pytest.raises(AlreadyQueued) as raised:
        compat.once_on_key.delay(unique_key)
    core.open_gate(unique_key)
    # a running execution: celery-once's timeout (3600) less the time it has run, as the
    # original's lock key, set at enqueue for the timeout, would say
    assert 3590 < raised.value.countdown <= 3600
    first.get(timeout=20)


def test_once_the_lock_clears_when_the_task_completes(worker: Any, unique_key: str) -> None:
    assert_a_call_after_the_end_is_published(compat.once_on_key, unique_key)


def test_once_graceful_returns_a_rejected_eager_result(worker: Any, unique_key: str) -> None:
    first = compat.once_graceful.delay(unique_key)
    duplicate = compat.once_graceful.delay(unique_key)
    assert isinstance(duplicate, EagerResult) and duplicate.state == states.REJECTED
    core.open_gate(unique_key)
    first.get(timeout=20)


def test_once_graceful_per_call_returns_a_rejected_eager_result(
    worker: Any, unique_key: str
) -> None:
    first = compat.once_on_key.delay(unique_key)
    duplicate = compat.once_on_key.apply_async((unique_key,), once={"graceful": True})
    assert isinstance(duplicate, EagerResult) and duplicate.state == states.REJECTED
    core.open_gate(unique_key)
    first.get(timeout=20)


def test_once_keys_lock_on_the_named_arguments_only(worker: Any, unique_key: str) -> None:
    other_key = f"{unique_key}-other"
    first = compat.once_on_key.delay(unique_key, 1)
    with pytest.raises(AlreadyQueued):
        compat.once_on_key.delay(unique_key, 2)
    second = compat.once_on_key.delay(other_key, 2)
    core.open_gate(unique_key)
    core.open_gate(other_key)
    assert first.get(timeout=20) == first.id
    assert second.get(timeout=20) == second.id


def test_once_without_keys_locks_on_every_argument(worker: Any, unique_key: str) -> None:
    first = compat.once_all_args.delay(unique_key, 1)
    second = compat.once_all_args.delay(unique_key, 2)
    with pytest.raises(AlreadyQueued):
        compat.once_all_args.delay(unique_key, 1)
    # one gate per run: the two run one after the other, both under their own lock
    core.open_gate(unique_key, 2)
    assert first.get(timeout=20) == first.id
    assert second.get(timeout=20) == second.id


def test_once_empty_keys_allow_one_call_whatever_the_arguments(
    worker: Any, unique_key: str
) -> None:
    first = compat.once_per_task.delay(unique_key, 1)
    with pytest.raises(AlreadyQueued):
        compat.once_per_task.delay(f"{unique_key}-2", 2)
    core.open_gate(unique_key)
    first.get(timeout=20)


def test_once_timeout_is_how_long_a_queued_call_blocks(worker: Any, unique_key: str) -> None:
    assert_a_queued_call_blocks_for(compat.once_timeout, unique_key, 60)


def test_once_unlock_before_run_lets_a_call_queue_while_one_runs_and_run_after_it(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    task = compat.once_unlock_before_run
    # queued (on a queue nobody consumes: an idle worker may start a call at once): refused
    queued_key = f"{unique_key}-queued"
    task.apply_async((queued_key,), queue=f"{queued_key}-nobody")
    with pytest.raises(AlreadyQueued):
        task.delay(queued_key)
    first = task.delay(unique_key)
    wait_until(lambda: runs(unique_key))
    second = task.delay(unique_key)  # running: a new call is queued
    assert second.id != first.id
    with pytest.raises(AlreadyQueued):
        task.delay(unique_key)
    core.open_gate(unique_key, 2)
    assert first.get(timeout=20) == first.id
    assert second.get(timeout=20) == second.id
    assert runs(unique_key) == [first.id, second.id]


def test_already_queued_survives_pickling() -> None:
    error = pickle.loads(pickle.dumps(AlreadyQueued(12, "k", "t-1")))
    assert (error.countdown, error.key, error.holder) == (12, "k", {"task_id": "t-1"})
    assert str(error) == "Expires in 12 seconds"


# -- celery-singleton: Singleton --------------------------------------------------------------


def test_singleton_a_duplicate_returns_the_existing_async_result(
    worker: Any, unique_key: str
) -> None:
    with published(compat.singleton_on_key) as ids:
        first = compat.singleton_on_key.delay(unique_key)
        second = compat.singleton_on_key.delay(unique_key, 5)  # unique_on=["key"]
    core.open_gate(unique_key)
    assert ids == [first.id] and second.id == first.id
    assert second.get(timeout=20) == first.id


def test_singleton_without_unique_on_compares_every_argument(worker: Any, unique_key: str) -> None:
    first = compat.singleton_all_args.delay(unique_key, 1)
    same = compat.singleton_all_args.delay(unique_key, 1)
    different = compat.singleton_all_args.delay(unique_key, 2)
    core.open_gate(unique_key, 2)
    assert same.id == first.id != different.id
    assert first.get(timeout=20) == first.id
    assert different.get(timeout=20) == different.id


def test_singleton_raise_on_duplicate_names_the_existing_task_id(
    worker: Any, unique_key: str
) -> None:
    first = compat.singleton_raises.delay(unique_key)
    with pytest.raises(DuplicateTaskError) as raised:
        compat.singleton_raises.delay(unique_key)
    core.open_gate(unique_key)
    assert raised.value.task_id == first.id
    assert isinstance(raised.value, LockError)
    first.get(timeout=20)


def test_singleton_lock_expiry_is_how_long_a_queued_call_blocks(
    worker: Any, unique_key: str
) -> None:
    assert_a_queued_call_blocks_for(compat.singleton_expiry, unique_key, 60)


def test_singleton_the_lock_clears_when_the_task_completes(worker: Any, unique_key: str) -> None:
    assert_a_call_after_the_end_is_published(compat.singleton_on_key, unique_key)
