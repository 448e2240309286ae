"""Enqueue-time deduplication (``dedupe_on_enqueue``) on a real worker and real Redis servers."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import pytest
import redis
from celery import Celery, group
from celery.beat import ScheduleEntry, Scheduler
from celery.signals import before_task_publish
from kombu.exceptions import OperationalError

from celery_singleton_lock import DuplicateTaskError, DuplicateTaskSkipped, LockedTask
from celery_singleton_lock.celery.config.lockers import forget_locker, locker_for
from celery_singleton_lock.engine import Lease, Owner, RedisLocker
from celery_singleton_lock.testing import RedisServer, free_port
from tests.celery import lockapp
from tests.celery.tasks import core, dedupe
from tests.support import CountingConnection, wait_until


@lockapp.app.task(
    bind=True,
    base=LockedTask,
    lock_on=("key",),
    dedupe_on_enqueue=True,
    on_duplicate="retry",
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.1,
    lock_max_retries=2,
)
def dedupe_lock_retry_twice(self: LockedTask, key: str) -> str:
    return str(self.request.id)


def name_of(task: Any, key: str) -> str:
    return str(task.lock_options.keyer.name((key,), {}))


@contextlib.contextmanager
def published(task: Any) -> Iterator[list[str]]:
    """Task ids of the messages of ``task`` published in this block."""
    ids: list[str] = []

    def record(sender: Any = None, headers: Any = None, **_: Any) -> None:
        if sender == task.name and headers:
            ids.append(headers["id"])

    before_task_publish.connect(record, weak=False)
    try:
        yield ids
    finally:
        before_task_publish.disconnect(record)


def runs(key: str) -> list[str]:
    return [run.decode() for run in core.store().lrange(f"runs:{key}", 0, -1)]


def test_a_thousand_duplicate_sends_publish_one_message(worker: Any, unique_key: str) -> None:
    started = time.perf_counter()
    with published(dedupe.dedupe_gated) as ids:
        results = [dedupe.dedupe_gated.delay(unique_key) for _ in range(1000)]
    took = time.perf_counter() - started
    core.open_gate(unique_key)
    print(f"1,000 duplicate delay() calls: {len(ids)} published, {took * 1000:.0f} ms in all")
    assert len(ids) == 1
    assert {result.id for result in results} == {ids[0]}
    assert results[-1].get(timeout=20) == ids[0]
    assert runs(unique_key) == [ids[0]]


def test_a_duplicate_of_a_running_task_gets_the_running_tasks_result(
    worker: Any, locker: RedisLocker, unique_key: str
) -> None:
    first = dedupe.dedupe_gated.delay(unique_key)
    wait_until(lambda: runs(unique_key))  # running: its acquire took the queued marker
    assert locker.markers.queued(name_of(dedupe.dedupe_gated, unique_key)) is None
    with published(dedupe.dedupe_gated) as ids:
        second = dedupe.dedupe_gated.delay(unique_key)
    core.open_gate(unique_key)
    assert ids == []
    assert second.id == first.id
    assert second.get(timeout=20) == first.id


def assert_a_call_after_the_end_is_published(task: Any, key: str) -> None:
    """A call of gated ``task`` sent once the previous one ended is published and runs."""
    core.open_gate(key, 2)
    first = task.delay(key)
    first.get(timeout=20)
    second = task.delay(key)
    assert second.id != first.id
    assert second.get(timeout=20) == second.id


def assert_a_queued_call_blocks_for(task: Any, key: str, seconds: float) -> None:
    """A queued call of gated ``task`` (due in 1 s) blocks duplicates for ``seconds`` more."""
    first = task.apply_async((key,), countdown=1)
    try:
        remaining = locker_for(task.app).markers.queued_for(name_of(task, key))
        assert remaining is not None and seconds < remaining <= seconds + 1
    finally:
        core.open_gate(key)
    first.get(timeout=20)


def test_a_call_after_the_task_ended_is_published(worker: Any, unique_key: str) -> None:
    assert_a_call_after_the_end_is_published(dedupe.dedupe_gated, unique_key)


def test_countdown_calls_are_deduplicated_like_any_other(worker: Any, unique_key: str) -> None:
    with published(dedupe.dedupe_gated) as ids:
        first = dedupe.dedupe_gated.apply_async((unique_key,), countdown=0.5)
        second = dedupe.dedupe_gated.apply_async((unique_key,), countdown=0.5)
        third = dedupe.dedupe_gated.delay(unique_key)
    core.open_gate(unique_key)
    assert ids == [first.id] and second.id == third.id == first.id
    assert first.get(timeout=20) == first.id


def test_the_queued_marker_of_a_countdown_call_outlives_its_countdown(
    worker: Any, store: redis.Redis, locker: RedisLocker, unique_key: str
) -> None:
    result = dedupe.dedupe_gated.apply_async((unique_key,), countdown=7200)
    try:
        queued = locker.keys(name_of(dedupe.dedupe_gated, unique_key)).queued
        ttl = dedupe.dedupe_gated.lock_options.queued_ttl
        assert store.pttl(queued) > (ttl + 7000) * 1000
    finally:
        lockapp.app.control.revoke(result.id)


def test_a_revoked_queued_task_has_its_marker_cleared_by_the_worker(
    worker: Any, locker: RedisLocker, unique_key: str
) -> None:
    name = name_of(dedupe.dedupe_gated, unique_key)
    result = dedupe.dedupe_gated.apply_async((unique_key,), countdown=1)
    assert locker.markers.queued(name) == result.id
    lockapp.app.control.revoke(result.id)
    wait_until(lambda: locker.markers.queued(name) is None, timeout=15)
    wait_until(lambda: result.state == "REVOKED", timeout=10)
    assert runs(unique_key) == []
    core.open_gate(unique_key)
    after = dedupe.dedupe_gated.delay(unique_key)
    assert after.id != result.id
    assert after.get(timeout=20) == after.id


def test_self_retry_is_not_blocked_by_its_own_marker(worker: Any, unique_key: str) -> None:
    result = dedupe.dedupe_retries_itself.delay(unique_key)
    assert result.get(timeout=20) == 1
    assert runs(unique_key) == [result.id, result.id]


def test_a_lock_retry_is_sent_again_while_the_lock_is_held(
    worker: Any, locker: RedisLocker, unique_key: str
) -> None:
    # Queued while the lock is free; by the time it runs, another execution holds the lock.
    # Its lock retries re-send its own id and must be published (not merged into the holder).
    name = name_of(dedupe.dedupe_lock_retry, unique_key)
    result = dedupe.dedupe_lock_retry.apply_async((unique_key,), countdown=0.5)
    holder = locker.try_acquire(name, 30, owner=Owner(task_id="holder"), renew=False)
    assert isinstance(holder, Lease)
    with published(dedupe.dedupe_lock_retry) as ids:
        wait_until(lambda: len(ids) >= 2, timeout=15)
    holder.release()
    assert result.get(timeout=20) == result.id
    assert set(ids) == {result.id}
    assert runs(unique_key) == [result.id]


def test_a_call_in_lock_retries_stays_queued_so_a_duplicate_send_gets_it(
    worker: Any, locker: RedisLocker, unique_key: str
) -> None:
    # Between a lock retry's acquire and its re-send the call is still queued: a duplicate
    # sent at any moment of its retries is never published beside it.
    task = dedupe.dedupe_lock_retry
    name = name_of(task, unique_key)
    with published(task) as ids:
        result = task.apply_async((unique_key,), countdown=0.5)  # queued while it is free
        holder = locker.try_acquire(name, 30, owner=Owner(task_id="holder"), renew=False)
        assert isinstance(holder, Lease)
        duplicates = []
        for _ in range(400):  # about 2 s of sends over 10 or more lock retries
            duplicates.append(task.delay(unique_key).id)
            if len(ids) >= 10:
                break
            time.sleep(0.005)
    holder.release()
    assert result.get(timeout=20) == result.id
    assert len(ids) >= 10, "the call did not retry while the lock was held"
    assert set(ids) == {result.id}
    assert set(duplicates) == {result.id}


def test_a_call_that_gives_up_its_lock_retries_is_no_longer_queued(
    worker: Any, locker: RedisLocker, unique_key: str
) -> None:
    name = name_of(dedupe_lock_retry_twice, unique_key)
    result = dedupe_lock_retry_twice.apply_async((unique_key,), countdown=0.5)
    holder = locker.try_acquire(name, 30, owner=Owner(task_id="holder"), renew=False)
    assert isinstance(holder, Lease)
    with pytest.raises(DuplicateTaskError):
        result.get(timeout=20)
    assert locker.markers.queued(name) is None
    holder.release()


def test_send_task_by_name_is_not_deduplicated_but_still_locked(
    worker: Any, unique_key: str
) -> None:
    task = dedupe.dedupe_gated
    with published(task) as ids:
        first = lockapp.app.send_task(task.name, (unique_key,))
        wait_until(lambda: runs(unique_key))
        second = lockapp.app.send_task(task.name, (unique_key,))
        with pytest.raises(DuplicateTaskSkipped):
            second.get(timeout=20)
    core.open_gate(unique_key)
    assert ids == [first.id, second.id]
    assert first.get(timeout=20) == first.id
    assert runs(unique_key) == [first.id]


def test_calls_inside_a_group_are_not_deduplicated_at_enqueue(worker: Any, unique_key: str) -> None:
    with published(dedupe.dedupe_gated) as ids:
        result = group(dedupe.dedupe_gated.s(unique_key) for _ in range(3)).apply_async()
    assert len(ids) == 3
    # the run-time lock still applies: one runs (held at its gate), the two others skip
    wait_until(lambda: [r.state for r in result.results].count("REVOKED") == 2, timeout=15)
    core.open_gate(unique_key)
    outcomes = result.join(timeout=20, propagate=False)
    assert sum(isinstance(outcome, DuplicateTaskSkipped) for outcome in outcomes) == 2
    assert len(runs(unique_key)) == 1


def test_a_deduplicated_task_costs_one_round_trip_to_enqueue_and_two_to_run(
    worker: Any, unique_key: str
) -> None:
    core.open_gate(unique_key, 26)
    dedupe.dedupe_gated.delay(f"{unique_key}").get(timeout=10)  # scripts loaded once
    name = dedupe.dedupe_gated.lock_options.keyer.name((unique_key,), {})
    CountingConnection.reset()
    for _ in range(25):
        dedupe.dedupe_gated.delay(unique_key).get(timeout=10)
    # the last release is sent without waiting; the round trips counted are those naming this
    # lock (the shared worker may still release another test's lock meanwhile)
    wait_until(lambda: len(CountingConnection.about(name)) >= 75, timeout=5)
    # enqueue (client), acquire + release (worker): the same counting pool serves both here
    assert CountingConnection.about(name) == ["EVALSHA", "EVALSHA", "EVAL"] * 25


# -- a broker that is not there -------------------------------------------------------------


@pytest.fixture
def dead_broker_app(lock_server: RedisServer) -> Iterator[Celery]:
    app = Celery("dead-broker", set_as_current=False)
    app.conf.update(
        broker_url=f"redis://127.0.0.1:{free_port()}/0",
        broker_connection_retry=False,
        broker_connection_max_retries=0,
        task_publish_retry=False,
        # kombu's channel retries (about 6 s per publish by default): the error at once
        broker_transport_options={"max_retries": 0},
        singleton_lock_url=lock_server.url,
    )
    yield app
    forget_locker(app)


def test_a_failed_publish_removes_its_marker_before_the_error_reaches_the_caller(
    dead_broker_app: Celery, unique_key: str
) -> None:
    @dead_broker_app.task(base=LockedTask, dedupe_on_enqueue=True, name="dead.dedupe")
    def dead_dedupe(key: str) -> None:
        pass

    locker = locker_for(dead_broker_app)
    name = dead_dedupe.lock_options.keyer.name((unique_key,), {})
    seen: list[Any] = []
    for _ in range(2):  # the second call is not blocked by the first one's marker
        with pytest.raises(OperationalError):
            dead_dedupe.delay(unique_key)
        seen.append(locker.markers.queued(name))
    assert seen == [None, None]


def test_beat_sends_through_apply_async_and_is_deduplicated(worker: Any, unique_key: str) -> None:
    scheduler = Scheduler(lockapp.app, lazy=True)
    entry = ScheduleEntry(
        name=f"every-tick-{unique_key}",
        task=dedupe.dedupe_gated.name,
        schedule=60.0,
        args=(unique_key,),
        app=lockapp.app,
    )
    with published(dedupe.dedupe_gated) as ids:
        results = [scheduler.apply_async(entry) for _ in range(3)]
    core.open_gate(unique_key)
    assert len(ids) == 1
    assert {result.id for result in results} == {ids[0]}
    assert results[0].get(timeout=20) == ids[0]
