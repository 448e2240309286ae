"""``lock_acquired`` (and ``lock_released``) cache their receivers per task: a receiver for
one task is never called for another, and one connected later is called from then on."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from celery_singleton_lock.celery.signals import lock_acquired
from tests.celery.conftest import assert_released, lock_key_of
from tests.celery.tasks import runtime

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
