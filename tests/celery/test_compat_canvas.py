"""The drop-ins in a canvas, side by side with the originals (as test_compat_side_by_side.py):
a duplicate sent with ``link`` / ``link_error``, as the first step of a chain, in a group or
in a chord's header is refused at the caller as the original refuses it (celery-once:
``AlreadyQueued`` raised; celery-singleton: nothing published, the existing task's
``AsyncResult`` returned), and publishes nothing, so no worker ever turns it into a FAILURE.

One case differs on purpose, asserted per implementation: a duplicate that the worker sends
as the next chain step of the task it has just run. The originals raise inside Celery's
tracer, which marks the task that ran FAILURE although its body succeeded; ours drops the step
with a WARNING and that task stays SUCCESS.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

pytest.importorskip("celery_singleton")

from celery import chain, chord, group, states

from tests.celery import compat_side, compatapp
from tests.celery.compat_side import ALREADY_QUEUED, needs_celery_once, running, start_worker
from tests.celery.test_enqueue_dedupe import published
from tests.celery.workers import Servers, unique
from tests.support import wait_until

# the shared fixtures, by name
queue = compat_side.queue
impl, key = compat_side.impl, compat_side.key


@pytest.fixture(scope="module")
def worker(servers: Servers, queue: str) -> Iterator[Any]:
    """Prefork, as the issue's migration was tried: the chain step is sent from a child."""
    yield from start_worker(servers, queue, pool="prefork")


def _with_link(task: Any, key: str) -> Any:
    return task.apply_async((key,), link=compatapp.record.si(unique("cb")))


def _with_link_error(task: Any, key: str) -> Any:
    return task.apply_async((key,), link_error=compatapp.record.si(unique("eb")))


def _first_of_a_chain(task: Any, key: str) -> Any:
    return chain(task.si(key), compatapp.record.si(unique("next"))).apply_async()


def _in_a_group(task: Any, key: str) -> Any:
    return group(task.si(key)).apply_async()


def _in_a_chord_header(task: Any, key: str) -> Any:
    return chord([task.si(key)], compatapp.record.si(unique("body"))).apply_async()


#: the canvas forms a duplicate is sent in, from the caller
FORMS: dict[str, Callable[[Any, str], Any]] = {
    "link": _with_link,
    "link_error": _with_link_error,
    "chain": _first_of_a_chain,
    "group": _in_a_group,
    "chord": _in_a_chord_header,
}


@pytest.fixture(params=sorted(FORMS))
def send_in_canvas(request: pytest.FixtureRequest) -> Callable[[Any, str], Any]:
    return FORMS[str(request.param)]


@needs_celery_once
def test_once_a_duplicate_in_a_canvas_raises_already_queued_and_publishes_nothing(
    worker: Any, impl: str, key: str, send_in_canvas: Callable[[Any, str], Any]
) -> None:
    task = compatapp.once_on_key[impl]
    with published(task) as ids:
        first = task.delay(key)
        with pytest.raises(ALREADY_QUEUED[impl]):
            send_in_canvas(task, key)
    compatapp.open_gate(key)
    assert ids == [first.id]
    assert running(key) == [first.id]


def test_singleton_a_duplicate_in_a_canvas_publishes_nothing(
    worker: Any, impl: str, key: str, send_in_canvas: Callable[[Any, str], Any]
) -> None:
    task = compatapp.singleton_on_key[impl]
    with published(task) as ids:
        first = task.delay(key)
        send_in_canvas(task, key)
    compatapp.open_gate(key)
    assert ids == [first.id]
    assert running(key) == [first.id]


def test_singleton_a_duplicate_with_a_link_returns_the_existing_async_result(
    worker: Any, impl: str, key: str
) -> None:
    task = compatapp.singleton_on_key[impl]
    first = task.delay(key)
    duplicate = _with_link(task, key)
    compatapp.open_gate(key)
    assert duplicate.id == first.id


#: The task that ran before a duplicate chain step: the originals raise in Celery's tracer
#: as it sends the step, which stores FAILURE for that task; ours drops the step (WARNING).
STATE_OF_THE_STEP_BEFORE = {"original": states.FAILURE, "ours": states.SUCCESS}
CHAIN_STEP_TASKS = {
    "once": lambda impl: compatapp.once_on_key[impl],
    "singleton_raises": lambda impl: compatapp.singleton_raises[impl],
}


@pytest.mark.parametrize("base", sorted(CHAIN_STEP_TASKS))
def test_a_duplicate_chain_step_fails_the_step_before_only_in_the_original(
    worker: Any, impl: str, key: str, base: str
) -> None:
    if base == "once" and compat_side.celery_once is None:
        pytest.skip("celery-once cannot be imported")
    task = CHAIN_STEP_TASKS[base](impl)
    warned = worker.count_in_log("callback or chain step not sent")
    first = task.delay(key)
    running(key)
    before = chain(compatapp.record.si(unique("before")), task.si(key)).apply_async().parent
    state = wait_until(lambda: before.state in states.READY_STATES and before.state)
    compatapp.open_gate(key)
    assert state == STATE_OF_THE_STEP_BEFORE[impl]
    assert running(key) == [first.id]
    if impl == "ours":
        assert worker.count_in_log("callback or chain step not sent") == warned + 1
