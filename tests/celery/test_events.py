"""What an operator sees: Celery events for each lock decision, and one log line for each."""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from typing import Any, Callable, Iterator

import celery
import pytest
from celery import states
from celery.events.state import State

from celery_singleton_lock import DuplicateTaskSkipped
from celery_singleton_lock.engine import Lease, Owner, RedisLocker
from tests.celery.tasks import core, policies, queueing, runtime
from tests.celery.workers import CeleryWorkerProcess, Servers
from tests.support import wait_until

#: every state Celery itself knows: an event of ours must never make another one
CELERY_STATES = states.ALL_STATES | {states.STARTED, states.RECEIVED, states.REJECTED}


class Events:
    """Events a real ``app.events.Receiver`` on the broker has seen, by type, fed as they come
    to a real ``celery.events.state.State`` (what Flower reads): ``states`` holds each task's
    state after each of its events, as (event type, state)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.state = State()
        self.states: dict[str, list[tuple[str, str]]] = {}

    def receive(self, event: dict[str, Any]) -> None:
        self.state.event(dict(event))
        uuid_ = event.get("uuid")
        task = self.state.tasks.get(uuid_) if uuid_ else None
        if task is not None:
            self.states.setdefault(uuid_, []).append((event["type"], task.state))
        self.seen.append(event)

    def states_of(self, task_id: str) -> set[str]:
        return {state for _, state in self.states.get(task_id, [])}

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
        receiver = app.events.Receiver(connection, handlers={"*": events.receive})
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
    options = task.lock_options  # where the task's own calls look (its slot table or key)
    name, owner = options.keyer.name((key,), {}), Owner(task_id=task_id)
    lease = locker.try_acquire(name, 30, owner=owner, renew=False, slotted=options.slotted)
    assert isinstance(lease, Lease)
    return lease


def _skipped_duplicate_event(
    celery_app: Any, locker: RedisLocker, unique_key: str
) -> tuple[dict[str, Any], Lease, Events, str]:
    """The ``lock-duplicate`` event of a call skipped behind a lock held from here, once its
    ``task-revoked`` has come too; the events seen and the call's task id."""
    lease = _hold(locker, policies.hold_skip, unique_key, "the-holder")
    with received_events(celery_app) as events:
        result = policies.hold_skip.delay(unique_key)
        with pytest.raises(DuplicateTaskSkipped):
            result.get(timeout=10)
        event = events.wait_for("lock-duplicate", uuid=result.id)
        events.wait_for("task-revoked", uuid=result.id)
    lease.release()
    return event, lease, events, result.id


def _lost_lock_run(celery_app: Any, unique_key: str) -> tuple[dict[str, Any], Events, str]:
    """The ``lock-lost`` event of a call that deletes its own lock key, once the call's
    ``task-succeeded`` and ``lock-released-late`` have come too (the release's reply, and
    so that event, may be read after the call's end is reported); the events seen and the
    call's task id."""
    with received_events(celery_app) as events:
        result = runtime.watches_its_lock.delay(unique_key)  # deletes its own lock key
        result.get(timeout=10)
        event = events.wait_for("lock-lost", uuid=result.id)
        events.wait_for("task-succeeded", uuid=result.id)
        events.wait_for("lock-released-late", uuid=result.id)
    return event, events, result.id


def test_a_skipped_duplicate_sends_a_lock_duplicate_event_naming_the_holder(
    worker: Any, celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    event, lease, _, _ = _skipped_duplicate_event(celery_app, locker, unique_key)
    assert (event["action"], event["holder"], event["key"]) == ("skip", "the-holder", lease.key)


def test_a_lock_duplicate_event_carries_the_task_name(
    worker: Any, celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    event, _, _, _ = _skipped_duplicate_event(celery_app, locker, unique_key)
    assert event["name"] == policies.hold_skip.name


def test_a_lock_duplicate_event_says_the_reason_held(
    worker: Any, celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    event, _, _, _ = _skipped_duplicate_event(celery_app, locker, unique_key)
    assert event["reason"] == "held"


def test_a_lost_lock_event_carries_the_task_name(
    worker: Any, celery_app: Any, unique_key: str
) -> None:
    event, _, _ = _lost_lock_run(celery_app, unique_key)
    assert event["name"] == runtime.watches_its_lock.name


def test_a_retried_duplicate_sends_a_lock_duplicate_event_with_action_retry(
    worker: Any, celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    lease = _hold(locker, policies.hold_retry, unique_key, "the-holder")
    with received_events(celery_app) as events:
        result = policies.hold_retry.delay(unique_key)
        event = events.wait_for("lock-duplicate", uuid=result.id)
        lease.release()
        result.get(timeout=20)
    assert (event["action"], event["holder"]) == ("retry", "the-holder")


def test_a_lost_lock_sends_a_lock_lost_event(worker: Any, celery_app: Any, unique_key: str) -> None:
    event, _, _ = _lost_lock_run(celery_app, unique_key)
    assert event["key"].startswith("singleton-lock:{")


def test_a_release_that_finds_the_lock_gone_sends_a_released_late_event(
    worker: Any, celery_app: Any, unique_key: str
) -> None:
    _, events, task_id = _lost_lock_run(celery_app, unique_key)
    assert events.of("lock-released-late", uuid=task_id)


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


def test_a_burst_of_skips_of_one_key_logs_one_warning(
    worker: Any, locker: RedisLocker, unique_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    lease = _hold(locker, policies.hold_skip, unique_key, "the-holder")
    with caplog.at_level(logging.INFO):
        results = [policies.hold_skip.delay(unique_key) for _ in range(8)]
        for result in results:
            wait_until(result.ready, timeout=30)
    lease.release()
    assert all(isinstance(result.result, DuplicateTaskSkipped) for result in results)
    warnings = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING
        and lease.key in r.getMessage()
        and "skipped" in r.getMessage()
    ]
    assert len(warnings) == 1


# -- what Flower and celery.events.state read ------------------------------------------------


def test_a_skipped_duplicate_reads_revoked_in_the_event_state(
    worker: Any, celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    _, _, events, task_id = _skipped_duplicate_event(celery_app, locker, unique_key)
    assert events.state.tasks[task_id].state == states.REVOKED


def test_a_skipped_duplicate_never_reads_a_state_celery_does_not_know(
    worker: Any, celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    _, _, events, task_id = _skipped_duplicate_event(celery_app, locker, unique_key)
    assert events.states_of(task_id) <= CELERY_STATES


#: whether this Celery's tracer sends a task-started for the run of a parked call (5.3 does not)
SECOND_STARTED = celery.VERSION >= (5, 5)


def test_a_parked_call_is_started_while_its_body_runs_and_success_after(
    worker: Any, celery_app: Any, store: Any, unique_key: str
) -> None:
    with received_events(celery_app) as events:
        holder = queueing.gated_queue.delay(unique_key)
        wait_until(lambda: store.llen(f"runs:{unique_key}") == 1, timeout=30)
        parked = queueing.gated_queue.delay(unique_key)
        events.wait_for("lock-duplicate", uuid=parked.id, action="queue")
        core.open_gate(unique_key)  # the holder ends; the parked call runs, at the gate
        wait_until(lambda: store.llen(f"runs:{unique_key}") == 2, timeout=30)
        if SECOND_STARTED:
            # while its body runs (held at the gate) the call reads STARTED. Celery 5.3's
            # tracer sends no task-started for the run of a parked call: its state then is
            # what the events of its parked attempt left, which is Celery's merging, not ours
            # (read STARTED in most runs, not in one loaded full run of the oldest corner)
            wait_until(lambda: events.state.tasks[parked.id].state == states.STARTED, timeout=30)
        core.open_gate(unique_key)
        assert parked.get(timeout=30) == parked.id and holder.get(timeout=30) == holder.id
        wait_until(lambda: events.state.tasks[parked.id].state == states.SUCCESS, timeout=10)
    assert events.states_of(parked.id) <= CELERY_STATES


def test_a_lost_lock_leaves_the_task_states_to_celery(
    worker: Any, celery_app: Any, unique_key: str
) -> None:
    _, events, task_id = _lost_lock_run(celery_app, unique_key)
    assert events.states_of(task_id) <= CELERY_STATES


# -- a worker with task events off sends none of ours ----------------------------------------


def test_a_worker_without_task_events_sends_no_lock_event_until_they_are_enabled(
    celery_app: Any, locker: RedisLocker, servers: Servers, unique_key: str
) -> None:
    with CeleryWorkerProcess(servers, queue=f"q-{unique_key}", heartbeat=True) as process:
        lease = _hold(locker, policies.hold_skip, unique_key, "the-holder")
        try:
            with received_events(celery_app) as events:
                quiet = policies.hold_skip.apply_async((unique_key,), queue=process.queue)
                wait_until(quiet.ready, timeout=30)
                celery_app.control.enable_events(destination=[process.name], reply=True)
                wait_until(lambda: process.count_in_log("lock events on"), timeout=30)
                heard = policies.hold_skip.apply_async((unique_key,), queue=process.queue)
                events.wait_for("lock-duplicate", uuid=heard.id)  # sent after quiet's would be
            assert events.of("lock-duplicate", uuid=quiet.id) == []
        finally:
            lease.release()
