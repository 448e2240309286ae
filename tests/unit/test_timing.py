"""The acquire and held times the metrics observe (``celery.observe.timing``), driven through
its receivers in the order a worker sends their signals."""

from __future__ import annotations

from typing import Iterator

import pytest

from celery_singleton_lock.celery.observe import timing


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    yield
    timing._started.clear()
    timing._acquired.clear()


def test_a_release_reported_after_task_postrun_is_still_timed() -> None:
    # a release sent without waiting is reported when its reply is read, often after postrun
    timing._on_acquired(task_id="t-1")
    timing._forget(task_id="t-1")
    assert timing.held("t-1") is not None


def test_a_release_is_timed_once() -> None:
    timing._on_acquired(task_id="t-1")
    timing.held("t-1")
    assert timing.held("t-1") is None


def test_locks_never_reported_released_are_remembered_up_to_the_bound() -> None:
    for index in range(timing.MAX_UNRELEASED + 10):
        timing._on_acquired(task_id=f"t-{index}")
    assert len(timing._acquired) == timing.MAX_UNRELEASED


def test_the_oldest_unreleased_lock_is_forgotten_first() -> None:
    for index in range(timing.MAX_UNRELEASED + 1):
        timing._on_acquired(task_id=f"t-{index}")
    assert timing.held("t-0") is None
    assert timing.held("t-1") is not None
