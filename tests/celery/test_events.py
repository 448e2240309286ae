"""What an operator sees: Celery events for each lock decision, and one log line for each."""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from typing import Any, Callable, Iterator

import pytest

from celery_singleton_lock import DuplicateTaskSkipped
from celery_singleton_lock.engine import Lease, Owner, RedisLocker
from tests.celery.tasks import policies, runtime
from tests.support import wait_until


class Events:
    """Events a real ``app.events.Receiver`` on the broker has seen, by type."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def of(self, type_: str, **fields: Any) -> list[dict[str, Any]]:
        return [
            event
            for event in list(self.seen)
            if event.get("type") == type_ and all(event.get(k) == v for k, v in fields.items())
        ]

    def wait_for(self, type_: str, **fields: Any) -> dict[str, Any]:
        found: Callable[[], list[dict[str, Any]]] = lambda: self.of(type_, **fields)  # noqa: E731
        return wait_until(found, timeout=10)[0]


@contextlib.contextmanager
def received_events(app: Any) -> Iterator[Events]:
    """A receiver consuming the app's event exchange in a thread, ready when yielded."""
    events = Events()
    with app.connection_for_read() as connection:
        receiver = app.events.Receiver(connection, handlers={"*": events.seen.append})
        thread = threading.Thread(
            target=receiver.capture, kwargs={"limit": None, "timeout": 30}, daemon=True
        )
        thread.start()
        try:
            # events are broadcast, not queued: wait until our own probe comes back
            probe = f"probe-{uuid.uuid4().hex[:8]}"

            def probe_seen() -> bool:
                with app.events.default_dispatcher() as dispatcher:
                    dispatcher.send("csl-test-probe", probe=probe)
                return bool(events.of("csl-test-probe", probe=probe))

            wait_until(probe_seen, timeout=10, interval=0.1)
            yield events
        finally:
            receiver.should_stop = True
            thread.join(5)


def _hold(locker: RedisLocker, task: Any, key: str, task_id: str) -> Lease:
    lease = locker.try_acquire(
        task.lock_options.keyer.name((key,), {}), 30, owner=Owner(task_id=task_id), renew=False
    )
    assert isinstance(lease, Lease)
    return lease


def _skipped_duplicate_event(
    celery_app: Any, locker: RedisLocker, unique_key: str
) -> tuple[dict[str, Any], Lease]:
    """The ``task-lock-duplicate`` event of a call skipped behind a lock held from here."""
    lease = _hold(locker, policies.hold_skip, unique_key, "the-holder")
    with received_events(celery_app) as events:
        result = policies.hold_skip.delay(unique_key)
        with pytest.raises(DuplicateTaskSkipped):
            result.get(timeout=10)
        event = events.wait_for("task-lock-duplicate", uuid=result.id)
    lease.release()
    return event, lease


def test_a_skipped_duplicate_sends_a_lock_duplicate_event_naming_the_holder(
    worker: Any, celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    event, lease = _skipped_duplicate_event(celery_app, locker, unique_key)
    assert (event["action"], event["holder"], event["key"]) == ("skip", "the-holder", lease.key)


def test_a_lock_duplicate_event_carries_the_task_name(
    worker: Any, celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    event, _ = _skipped_duplicate_event(celery_app, locker, unique_key)
    assert event["name"] == policies.hold_skip.name


def test_a_lock_duplicate_event_says_the_reason_held(
    worker: Any, celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    event, _ = _skipped_duplicate_event(celery_app, locker, unique_key)
    assert event["reason"] == "held"


def test_a_lost_lock_event_carries_the_task_name(
    worker: Any, celery_app: Any, unique_key: str
) -> None:
    with received_events(celery_app) as events:
        result = runtime.watches_its_lock.delay(unique_key)
        result.get(timeout=10)
        event = events.wait_for("task-lock-lost", uuid=result.id)
    assert event["name"] == runtime.watches_its_lock.name


def test_a_retried_duplicate_sends_a_lock_duplicate_event_with_action_retry(
    worker: Any, celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    lease = _hold(locker, policies.hold_retry, unique_key, "the-holder")
    with received_events(celery_app) as events:
        result = policies.hold_retry.delay(unique_key)
        event = events.wait_for("task-lock-duplicate", uuid=result.id)
        lease.release()
        result.get(timeout=20)
    assert (event["action"], event["holder"]) == ("retry", "the-holder")


def test_a_lost_lock_sends_a_lock_lost_event(worker: Any, celery_app: Any, unique_key: str) -> None:
    with received_events(celery_app) as events:
        result = runtime.watches_its_lock.delay(unique_key)
        result.get(timeout=10)
        event = events.wait_for("task-lock-lost", uuid=result.id)
    assert event["key"].startswith("singleton-lock:{")


def test_a_release_that_finds_the_lock_gone_sends_a_released_late_event(
    worker: Any, celery_app: Any, unique_key: str
) -> None:
    with received_events(celery_app) as events:
        result = runtime.watches_its_lock.delay(unique_key)  # deletes its own lock key
        result.get(timeout=10)
        events.wait_for("task-lock-released-late", uuid=result.id)


def test_a_skipped_duplicate_logs_its_decision_once_and_no_ignored_line(
    worker: Any, locker: RedisLocker, unique_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    lease = _hold(locker, policies.hold_skip, unique_key, "the-holder")
    with caplog.at_level(logging.INFO):
        result = policies.hold_skip.delay(unique_key)
        with pytest.raises(DuplicateTaskSkipped):
            result.get(timeout=10)
    lease.release()
    about_it = [r for r in caplog.records if result.id in r.getMessage()]
    assert [(r.name, r.levelname) for r in about_it if "received" not in r.getMessage()] == [
        ("celery_singleton_lock.duplicate", "WARNING")
    ]
