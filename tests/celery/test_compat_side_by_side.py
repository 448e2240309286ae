"""celery_singleton_lock.compat side by side with the packages it replaces: every scenario runs
against celery-once's ``QueueOnce`` / celery-singleton's ``Singleton`` ("original") and against
ours, the same task shape and options, on the same real Redis and a real ``celery worker``
(tests/celery/compatapp.py). Where ours differs on purpose (a lock shorter than the run, a
crashed worker) the difference is asserted, per implementation. More of them, on the same
helpers (tests/celery/compat_side.py): test_compat_canvas.py, test_compat_settings.py.

Skipped when celery-singleton is not installed (it is in the ``test`` extra); the celery-once
half is skipped when celery-once cannot be imported: it is not in the ``test`` extra, as its
3.0.1 imports ``six`` without declaring it (``pip install celery-once six``; ``bench`` extra).
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

pytest.importorskip("celery_singleton")

import celery_singleton
from celery import states
from celery.result import EagerResult

from tests.celery import compat_side, compatapp
from tests.celery.compat_side import (
    ALREADY_QUEUED,
    DUPLICATE_TASK_ERROR,
    assert_a_queued_call_blocks_for,
    celery_once,
    needs_celery_once,
    running,
    seconds_a_queued_call_blocks,
    start_worker,
)
from tests.celery.test_enqueue_dedupe import published
from tests.celery.workers import Servers, WorkerGroup, unique, worker_group
from tests.support import wait_until

APP = "tests.celery.compatapp"

# the shared fixtures, by name
queue = compat_side.queue
impl, key = compat_side.impl, compat_side.key


@pytest.fixture(scope="module")
def worker(servers: Servers, queue: str) -> Iterator[Any]:
    """One real ``celery worker`` (threads, 4 slots) serving every task of compatapp."""
    yield from start_worker(servers, queue)


# -- celery-once: QueueOnce ---------------------------------------------------------------------


@needs_celery_once
def test_once_a_duplicate_of_a_queued_call_raises_already_queued_and_publishes_nothing(
    worker: Any, impl: str, key: str
) -> None:
    task = compatapp.once_on_key[impl]
    with published(task) as ids:
        first = task.delay(key)
        with pytest.raises(ALREADY_QUEUED[impl]) as raised:
            task.delay(key)
    compatapp.open_gate(key)
    assert ids == [first.id]
    assert 3590 < raised.value.countdown <= 3600  # the ONCE setting's default_timeout
    assert raised.value.message.startswith("Expires in ")
    assert running(key) == [first.id]


@needs_celery_once
def test_once_a_call_while_the_task_runs_raises_already_queued(
    worker: Any, impl: str, key: str
) -> None:
    task = compatapp.once_on_key[impl]
    first = task.delay(key)
    running(key)
    with published(task) as ids, pytest.raises(ALREADY_QUEUED[impl]) as raised:
        task.delay(key)
    compatapp.open_gate(key)
    assert ids == []
    assert compatapp.runs(key) == [first.id]
    # the timeout (default_timeout 3600) less the time since the call: not the lock's TTL
    assert 3590 < raised.value.countdown <= 3600


@needs_celery_once
def test_once_a_call_after_the_task_ended_is_published(worker: Any, impl: str, key: str) -> None:
    task = compatapp.once_on_key[impl]
    task.delay(key)
    compatapp.open_gate(key)
    running(key)
    with published(task) as ids:
        wait_until(lambda: _sent_or_none(task, key))
    compatapp.open_gate(key)
    assert len(ids) == 1
    assert running(key, 2)[1] == ids[0]


def _sent_or_none(task: Any, key: str) -> Any:
    try:
        return task.delay(key)
    except tuple(error for error in ALREADY_QUEUED.values() if error is not None):
        return None


#: graceful: celery-once 3.0.1 returns an EagerResult in state REJECTED (its README says None)
def _is_rejected(result: Any) -> bool:
    return isinstance(result, EagerResult) and result.state == states.REJECTED


@needs_celery_once
def test_once_graceful_duplicate_returns_a_rejected_eager_result(
    worker: Any, impl: str, key: str
) -> None:
    task = compatapp.once_graceful[impl]
    with published(task) as ids:
        first = task.delay(key)
        duplicate = task.delay(key)
    compatapp.open_gate(key)
    assert ids == [first.id]
    assert _is_rejected(duplicate)


@needs_celery_once
def test_once_graceful_per_call_is_the_same_as_graceful_on_the_task(
    worker: Any, impl: str, key: str
) -> None:
    task = compatapp.once_on_key[impl]
    with published(task) as ids:
        first = task.delay(key)
        duplicate = task.apply_async((key,), once={"graceful": True})
    compatapp.open_gate(key)
    assert ids == [first.id]
    assert _is_rejected(duplicate)


@needs_celery_once
def test_once_keys_lock_on_the_named_arguments_only(worker: Any, impl: str, key: str) -> None:
    task = compatapp.once_on_key[impl]
    other_key = f"{key}-other"
    with published(task) as ids:
        first = task.delay(key, 1)
        with pytest.raises(ALREADY_QUEUED[impl]):
            task.delay(key, 2)
        second = task.delay(other_key, 2)
    compatapp.open_gate(key)
    compatapp.open_gate(other_key)
    assert ids == [first.id, second.id]


@needs_celery_once
def test_once_without_keys_locks_on_every_argument(worker: Any, impl: str, key: str) -> None:
    task = compatapp.once_all_args[impl]
    with published(task) as ids:
        first = task.delay(key, 1)
        second = task.delay(key, 2)
        with pytest.raises(ALREADY_QUEUED[impl]):
            task.delay(key, 1)
    compatapp.open_gate(key, 2)
    assert ids == [first.id, second.id]
    running(key, 2)


@needs_celery_once
def test_once_timeout_is_how_long_a_queued_call_blocks(worker: Any, impl: str, key: str) -> None:
    task = compatapp.once_timeout[impl]
    task.apply_async((key,), queue=unique("nobody"))  # never consumed: stays queued
    with pytest.raises(ALREADY_QUEUED[impl]) as raised:
        task.delay(key)
    assert 50 < raised.value.countdown <= 60
    assert 50 < seconds_a_queued_call_blocks(task, impl, (key,)) <= 60


@needs_celery_once
def test_once_unlock_before_run_lets_a_call_queue_while_one_runs(
    worker: Any, impl: str, key: str
) -> None:
    task = compatapp.once_unlock_before_run[impl]
    # queued (on a queue nobody consumes: an idle worker may start a call at once): refused
    queued_key = f"{key}-queued"
    task.apply_async((queued_key,), queue=unique("nobody"))
    with pytest.raises(ALREADY_QUEUED[impl]):
        task.delay(queued_key)
    first = task.delay(key)
    running(key)
    with published(task) as ids:
        second = task.delay(key)  # running: a new call is queued
    compatapp.open_gate(key, 2)
    assert ids == [second.id] != [first.id]
    assert running(key, 2) == [first.id, second.id]


#: unlock_before_run: the original runs the call queued meanwhile at once, beside the running
#: one (it has no run-time lock); ours runs it after it (the run-time lock, on_duplicate retry).
OVERLAPS_WITH_UNLOCK_BEFORE_RUN = {"original": 1, "ours": 0}


@needs_celery_once
def test_once_unlock_before_run_the_call_queued_meanwhile_overlaps_only_in_the_original(
    worker: Any, impl: str, key: str
) -> None:
    task = compatapp.once_unlock_before_run[impl]
    task.delay(key)
    running(key)
    task.delay(key)
    time.sleep(1.0)  # the original's second body starts at once; ours retries meanwhile
    compatapp.open_gate(key, 2)
    running(key, 2)
    wait_until(lambda: compatapp.store().get(f"gauge:{key}") == b"0")
    overlaps = int(compatapp.store().get(f"overlaps:{key}") or 0)
    assert overlaps == OVERLAPS_WITH_UNLOCK_BEFORE_RUN[impl]


#: A run longer than once's timeout: the original's lock expires mid-run and a duplicate is
#: queued (and runs beside it); ours refuses it: the running execution's lock is renewed.
DUPLICATE_PAST_THE_TIMEOUT_PUBLISHED = {"original": 1, "ours": 0}


@needs_celery_once
def test_once_a_run_longer_than_its_timeout_keeps_its_lock_only_in_ours(
    worker: Any, impl: str, key: str
) -> None:
    task = compatapp.once_short[impl]  # timeout 2 s
    task.delay(key, 0, 4.0)  # body 4 s
    running(key)
    time.sleep(2.5)
    with published(task) as ids:
        _sent_or_none(task, key)
    assert len(ids) == DUPLICATE_PAST_THE_TIMEOUT_PUBLISHED[impl]
    compatapp.open_gate(key)


# -- celery-singleton: Singleton ----------------------------------------------------------------


def test_singleton_a_duplicate_returns_the_existing_async_result_and_publishes_nothing(
    worker: Any, impl: str, key: str
) -> None:
    task = compatapp.singleton_on_key[impl]
    with published(task) as ids:
        first = task.delay(key)
        queued_duplicate = task.delay(key, 5)  # unique_on=["key"]
    running(key)
    with published(task) as later:
        running_duplicate = task.delay(key)
    compatapp.open_gate(key)
    assert ids == [first.id] and later == []
    assert queued_duplicate.id == running_duplicate.id == first.id


def test_singleton_without_unique_on_compares_every_argument(
    worker: Any, impl: str, key: str
) -> None:
    task = compatapp.singleton_all_args[impl]
    with published(task) as ids:
        first = task.delay(key, 1)
        same = task.delay(key, 1)
        different = task.delay(key, 2)
    compatapp.open_gate(key, 2)
    assert ids == [first.id, different.id]
    assert same.id == first.id
    running(key, 2)


def test_singleton_raise_on_duplicate_names_the_existing_task_id(
    worker: Any, impl: str, key: str
) -> None:
    task = compatapp.singleton_raises[impl]
    first = task.delay(key)
    with pytest.raises(DUPLICATE_TASK_ERROR[impl]) as raised:
        task.delay(key)
    compatapp.open_gate(key)
    assert raised.value.task_id == first.id


def test_singleton_lock_expiry_is_how_long_a_queued_call_blocks(
    worker: Any, impl: str, key: str
) -> None:
    assert_a_queued_call_blocks_for(compatapp.singleton_expiry[impl], impl, key, 60)


def test_singleton_a_call_after_the_task_ended_is_published(
    worker: Any, impl: str, key: str
) -> None:
    task = compatapp.singleton_on_key[impl]
    first = task.delay(key)
    compatapp.open_gate(key)
    running(key)
    second = wait_until(lambda: (r := task.delay(key)).id != first.id and r)
    compatapp.open_gate(key)
    assert running(key, 2) == [first.id, second.id]


#: A run longer than lock_expiry: the original's lock expires mid-run and a duplicate gets a
#: new task (it runs beside the first); ours returns the running task's AsyncResult.
def test_singleton_a_run_longer_than_lock_expiry_keeps_its_lock_only_in_ours(
    worker: Any, impl: str, key: str
) -> None:
    task = compatapp.singleton_short[impl]  # lock_expiry 2 s
    first = task.delay(key, 0, 4.0)  # body 4 s
    running(key)
    time.sleep(2.5)
    with published(task) as ids:
        duplicate = task.delay(key)
    compatapp.open_gate(key)  # the original's duplicate, if it runs
    if impl == "original":
        assert ids == [duplicate.id] != [first.id]
    else:
        assert ids == [] and duplicate.id == first.id


# -- a worker killed mid-run --------------------------------------------------------------------


@pytest.fixture(scope="module")
def crashed(servers: Servers, queue: str) -> Iterator[dict[str, Any]]:
    """Each crash task's call running on a worker of its own queue, then ``kill -9`` of that
    worker's whole process group; yields ``{task name: key}`` 3 s later (ours' lease: 2 s)."""
    crash_queue = unique("crash")
    calls: dict[str, str] = {}
    group: WorkerGroup
    with worker_group(servers) as group:
        group.start(1, queue=crash_queue, pool="threads", concurrency=4, app=APP)
        for pair in (compatapp.once_crash, compatapp.singleton_crash):
            for task in pair.values():  # no original QueueOnce without celery-once
                calls[task.name] = unique("k")
                task.apply_async((calls[task.name], 0, 30.0), queue=crash_queue)
        for call_key in calls.values():
            running(call_key)
        group.kill_all()
        time.sleep(3.0)
        yield calls
    for task_name in calls:  # what the originals left behind
        task = compatapp.app.tasks[task_name]
        if isinstance(task, celery_singleton.Singleton):
            compatapp.store().delete(task.generate_lock(task.name, (calls[task_name],), {}))
        elif celery_once is not None and isinstance(task, celery_once.QueueOnce):
            compatapp.store().delete(task.get_key((calls[task_name],), {}))


@needs_celery_once
def test_once_a_crashed_worker_blocks_the_key_for_the_timeout_original_for_lock_ttl_ours(
    crashed: dict[str, str], impl: str
) -> None:
    task = compatapp.once_crash[impl]
    if impl == "original":  # an hour (default_timeout 3600)
        with pytest.raises(celery_once.AlreadyQueued) as raised:
            task.delay(crashed[task.name])
        assert raised.value.countdown > 3500
    else:  # lock_ttl=2, gone 3 s after the kill
        result = task.apply_async((crashed[task.name],), queue=unique("nobody"))
        assert result is not None


def test_singleton_a_crashed_worker_blocks_the_key_forever_original_for_lock_ttl_ours(
    crashed: dict[str, str], impl: str
) -> None:
    task = compatapp.singleton_crash[impl]
    key = crashed[task.name]
    if impl == "original":  # no lock_expiry: the key never expires
        lock = task.generate_lock(task.name, (key,), {})
        assert compatapp.store().pttl(lock) == -1
        assert task.delay(key).id == compatapp.store().get(lock).decode()
    else:
        with published(task) as ids:
            task.apply_async((key,), queue=unique("nobody"))
        assert len(ids) == 1
