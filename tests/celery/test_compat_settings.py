"""celery-singleton's app-wide settings and its ``clear_locks``, side by side with the original
(as test_compat_side_by_side.py), on a real worker of tests/celery/compatsettingsapp.py, whose
apps set ``singleton_lock_expiry``, ``singleton_key_prefix`` and (one of them)
``singleton_raise_on_duplicate``.

``clear_locks`` differs on purpose, asserted per implementation: celery-singleton deletes the
lock of a running task too (a duplicate is then published); ours never touches a lock a
worker holds.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

pytest.importorskip("celery_singleton")

from celery_singleton_lock.celery.config.lockers import forget_locker
from tests.celery import compat_side, compatapp, compatsettingsapp
from tests.celery.compat_side import (
    CLEAR_LOCKS,
    DUPLICATE_TASK_ERROR,
    assert_a_queued_call_blocks_for,
    running,
)
from tests.celery.test_enqueue_dedupe import published
from tests.celery.workers import Servers, unique

# the shared fixtures, by name
queue = compat_side.queue
impl, key = compat_side.impl, compat_side.key


@pytest.fixture(scope="module")
def worker(servers: Servers, queue: str) -> Iterator[Any]:
    """A worker of compatsettingsapp on the module's queue; the test process sends through
    both of its apps, to that queue."""
    compatsettingsapp.configure(
        broker_url=servers.broker_url, lock_url=servers.lock.url, queue=queue
    )
    yield from compat_side.start_worker(servers, queue, app="tests.celery.compatsettingsapp")
    forget_locker(compatsettingsapp.app)
    forget_locker(compatsettingsapp.other)


def test_singleton_lock_expiry_setting_is_how_long_a_queued_call_blocks(
    worker: Any, impl: str, key: str
) -> None:
    task = compatsettingsapp.on_key[impl]
    assert_a_queued_call_blocks_for(task, impl, key, compatsettingsapp.EXPIRY)


def test_singleton_key_prefix_keeps_apps_of_another_prefix_apart(
    worker: Any, impl: str, key: str
) -> None:
    ours, other = compatsettingsapp.on_key[impl], compatsettingsapp.other_on_key[impl]
    with published(ours) as ids:  # both tasks have one name
        elsewhere = other.apply_async((key,), queue=unique("nobody"))
        here = ours.delay(key)
    compatapp.open_gate(key)
    assert here.id != elsewhere.id
    assert ids == [elsewhere.id, here.id]
    assert running(key) == [here.id]


def test_singleton_raise_on_duplicate_setting_raises_naming_the_existing_task(
    worker: Any, impl: str, key: str
) -> None:
    task = compatsettingsapp.other_on_key[impl]
    nobody = unique("nobody")
    first = task.apply_async((key,), queue=nobody)  # never consumed: stays queued
    with published(task) as ids, pytest.raises(DUPLICATE_TASK_ERROR[impl]) as raised:
        task.apply_async((key,), queue=nobody)
    assert raised.value.task_id == first.id
    assert ids == []


def test_clear_locks_lets_a_call_lost_from_the_queue_be_sent_again(
    worker: Any, impl: str, key: str
) -> None:
    task = compatsettingsapp.on_key[impl]
    lost = task.apply_async((key,), queue=unique("nobody"))  # never consumed
    assert task.delay(key).id == lost.id
    CLEAR_LOCKS[impl](compatsettingsapp.app)
    with published(task) as ids:
        again = task.delay(key)
    compatapp.open_gate(key)
    assert ids == [again.id] != [lost.id]
    assert running(key) == [again.id]


#: clear_locks while the call runs: celery-singleton deletes its lock, so a duplicate is
#: published (and runs beside it); ours leaves a held lock alone.
DUPLICATES_PUBLISHED_AFTER_CLEAR_LOCKS = {"original": 1, "ours": 0}


def test_clear_locks_leaves_the_lock_of_a_running_task_only_in_ours(
    worker: Any, impl: str, key: str
) -> None:
    task = compatsettingsapp.on_key[impl]
    first = task.delay(key)
    running(key)
    CLEAR_LOCKS[impl](compatsettingsapp.app)
    with published(task) as ids:
        duplicate = task.delay(key)
    compatapp.open_gate(key, 2)
    assert len(ids) == DUPLICATES_PUBLISHED_AFTER_CLEAR_LOCKS[impl]
    assert (duplicate.id == first.id) is (impl == "ours")
