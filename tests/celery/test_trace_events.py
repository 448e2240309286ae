"""OpenTelemetry span events for lock decisions: added to the span current around the
execution (the Celery instrumentation's ``run/<task>``; here a span the test opens around
``apply()``), recorded by the SDK's in-memory exporter."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from celery_singleton_lock.celery.observe import tracing
from celery_singleton_lock.engine import Lease, Owner, RedisLocker
from tests.celery.tasks import policies, runtime

trace = pytest.importorskip("opentelemetry.trace")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
export = pytest.importorskip("opentelemetry.sdk.trace.export")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")


@pytest.fixture(scope="module")
def exporter() -> Any:
    """The process's tracer provider (set once: OpenTelemetry refuses to replace it)."""
    spans = in_memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(spans))
    trace.set_tracer_provider(provider)
    return spans


@pytest.fixture
def traced(exporter: Any, celery_app: Any) -> Iterator[Any]:
    exporter.clear()
    assert tracing.connect(celery_app.conf)
    yield exporter
    tracing.disconnect()


def run_in_span(task: Any, *args: Any) -> Any:
    """``task.apply(args)`` inside a span named as the Celery instrumentation names it."""
    with trace.get_tracer("test").start_as_current_span(f"run/{task.name}"):
        return task.apply(args=args)


def events_of(exporter: Any, name: str) -> list[Any]:
    return [
        event
        for span in exporter.get_finished_spans()
        for event in span.events
        if event.name == name
    ]


def test_an_acquire_adds_a_lock_acquired_event_with_its_fence(traced: Any, unique_key: str) -> None:
    result = run_in_span(runtime.fenced, unique_key)
    (event,) = events_of(traced, "lock.acquired")
    assert event.attributes["celery.lock.fence"] == result.get()


def test_an_acquire_says_how_long_the_execution_waited_for_its_lock(
    traced: Any, unique_key: str
) -> None:
    run_in_span(runtime.fenced, unique_key)
    (event,) = events_of(traced, "lock.acquired")
    assert event.attributes["celery.lock.waited_seconds"] >= 0


def test_a_duplicate_adds_a_lock_duplicate_event_with_action_and_reason(
    traced: Any, celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    name = policies.hold_skip.lock_options.keyer.name((unique_key,), {})
    lease = locker.try_acquire(name, 30, owner=Owner(task_id="the-holder"), renew=False)
    assert isinstance(lease, Lease)
    try:
        run_in_span(policies.hold_skip, unique_key)
    finally:
        lease.release()
    (event,) = events_of(traced, "lock.duplicate")
    assert (event.attributes["celery.lock.action"], event.attributes["celery.lock.reason"]) == (
        "skip",
        "held",
    )


def test_a_lost_lock_adds_a_lock_lost_event_to_the_span_of_its_execution(
    traced: Any, unique_key: str
) -> None:
    result = run_in_span(runtime.watches_its_lock, unique_key)
    assert result.get()["lost"]
    assert len(events_of(traced, "lock.lost")) == 1
