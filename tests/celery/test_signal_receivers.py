"""``lock_acquired`` (and ``lock_released``) cache their receivers per task: a receiver for
one task is never called for another, and one connected later is called from then on. A
worker's deferred release is reported at the release's time: ``lock_released`` promptly on an
idle worker, and the hold it times ends when the release was sent."""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

from celery_singleton_lock.celery.observe import timing
from celery_singleton_lock.celery.signals import lock_acquired, lock_released
from celery_singleton_lock.engine import RedisLocker
from tests.celery.conftest import assert_released, lock_key_of
from tests.celery.tasks import policies, runtime
from tests.support import wait_until

_connected: list[tuple[Any, Any]] = []


@pytest.fixture
def heard() -> Iterator[list[tuple[str, Any]]]:
    calls: list[tuple[str, Any]] = []
    yield calls
    while _connected:
        signal, sender = _connected.pop()
        signal.disconnect(sender=sender, dispatch_uid="test-heard")


def listen(heard: list[tuple[str, Any]], signal: Any, sender: Any) -> None:
    def receiver(sender: Any = None, **fields: Any) -> None:
        heard.append((signal.name, sender))

    signal.connect(receiver, sender=sender, weak=False, dispatch_uid="test-heard")
    _connected.append((signal, sender))


def registered(celery_app: Any, task: Any) -> Any:
    """The task instance the worker and ``apply`` send as ``sender`` (not the proxy)."""
    return celery_app.tasks[task.name]


def test_a_receiver_for_another_task_is_not_called(
    celery_app: Any, heard: list[tuple[str, Any]], unique_key: str
) -> None:
    listen(heard, lock_acquired, registered(celery_app, runtime.fenced))
    runtime.reports_its_state.apply(args=(unique_key,)).get()
    assert heard == []


def test_a_receiver_connected_after_a_task_ran_is_called_from_then_on(
    celery_app: Any, heard: list[tuple[str, Any]], store: Any, unique_key: str
) -> None:
    task = registered(celery_app, runtime.reports_its_state)
    listen(heard, lock_acquired, registered(celery_app, runtime.fenced))
    runtime.reports_its_state.apply(args=(unique_key,)).get()  # cached: none for this task
    listen(heard, lock_acquired, task)
    runtime.reports_its_state.apply(args=(unique_key,)).get()
    assert_released(store, lock_key_of(runtime.reports_its_state, unique_key))
    assert heard == [("lock_acquired", task)]


@pytest.fixture
def lock_times(celery_app: Any) -> Iterator[dict[str, float]]:
    """When ``hold_skip``'s lock was taken and ``lock_released`` came (``time.monotonic()``
    in this process: the in-process worker's), and the hold that timing measured then."""
    task = registered(celery_app, policies.hold_skip)
    times: dict[str, float] = {}

    def acquired(**_: Any) -> None:
        times["acquired"] = time.monotonic()

    def released(task_id: str, **_: Any) -> None:
        times["released"] = time.monotonic()
        times["held"] = timing.held(task_id) or 0.0

    timing.connect(task, user="test")
    lock_acquired.connect(acquired, sender=task, weak=False, dispatch_uid="test-times")
    lock_released.connect(released, sender=task, weak=False, dispatch_uid="test-times")
    yield times
    lock_released.disconnect(sender=task, dispatch_uid="test-times")
    lock_acquired.disconnect(sender=task, dispatch_uid="test-times")
    timing.disconnect(task, user="test")


def test_on_an_idle_worker_lock_released_comes_promptly_and_the_hold_ends_at_the_release(
    worker: Any, lock_times: dict[str, float], unique_key: str
) -> None:
    # The reply of the worker's release (sent without waiting) was read, and reported, at the
    # renewer's next second: 1 s after a 10 ms body, and so was the hold.
    policies.hold_skip.delay(unique_key, seconds=0.01).get(timeout=10)
    wait_until(lambda: "released" in lock_times, timeout=5, interval=0.005)
    assert lock_times["released"] - lock_times["acquired"] < 0.5  # the body took 0.01 of it
    assert 0.01 <= lock_times["held"] < 0.5


def test_a_busy_worker_does_not_wake_its_renewer_per_task(
    worker: Any, locker: RedisLocker, unique_key: str
) -> None:
    renewer = locker.renewer
    wakeups = renewer.wakeups
    results = [policies.hold_skip.delay(f"{unique_key}-{index}") for index in range(100)]
    for result in results:
        result.get(timeout=30)
    assert (renewer.wakeups - wakeups) / len(results) < 0.1
