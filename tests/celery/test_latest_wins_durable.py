"""Policy ``replace`` on the in-process worker: a displaced call is never left PENDING by a
worker that died between the displacing script and the marking (the hand-off sweeper marks
it), and a stale copy of a displaced call neither runs nor displaces the newer call."""

from __future__ import annotations

from typing import Any

import pytest
from celery.exceptions import TaskRevokedError
from celery.worker import state
from kombu.utils import json

from celery_singleton_lock.celery.config.resolution import handoff_settings
from celery_singleton_lock.celery.worker.handoff_sweeper import HandOffSweeper
from celery_singleton_lock.engine import Latest, Owner, Parked, RedisLocker
from celery_singleton_lock.engine.latest import superseded_keys
from tests.celery import latestapp
from tests.celery.test_latest_wins import _running, _waiting
from tests.support import wait_until


def park_newest(locker: RedisLocker, key: str, task_id: str, value: str) -> Parked:
    """The acquire a worker runs for a call of ``newest`` that finds the lock held, alone: as
    if the worker died as the script returned, before marking what it displaced."""
    name = latestapp.newest.lock_options.keyer.name((key, value), {})
    signature = {"task": latestapp.newest.name, "args": [key, value], "kwargs": {}, "options": {}}
    parked = locker.try_acquire(
        name,
        ttl=30,
        owner=Owner(task_id=task_id),
        renew=False,
        park=f"{task_id}\n{json.dumps(signature)}".encode(),  # type: ignore[no-untyped-call]
        reservation_ttl=30,
        latest=Latest(),
    )
    assert isinstance(parked, Parked)
    return parked


def sweep_after_the_grace(celery_app: Any, locker: RedisLocker, key: str) -> None:
    """One tick of a hand-off sweeper once the displacing worker's grace has passed."""
    name = latestapp.newest.lock_options.keyer.name((key, 0), {})
    locker.client.zadd(superseded_keys(locker.keys(name), locker.shared.superseded)[2], {name: 0})
    interval, reservation_ttl = handoff_settings(celery_app.conf)
    HandOffSweeper(celery_app, interval, reservation_ttl).tick()


def displaced_by_the_worker(locker: RedisLocker, key: str, seconds: float) -> tuple[Any, ...]:
    """v1 running for ``seconds``, v2 waiting, then displaced by v3 and marked REVOKED by the
    worker: their AsyncResults."""
    first = _running(key, "v1", seconds)
    displaced = latestapp.newest.delay(key, "v2")
    wait_until(lambda: _waiting(locker, key) == [displaced.id.encode()], timeout=10)
    newer = latestapp.newest.delay(key, "v3")
    wait_until(lambda: displaced.state == "REVOKED", timeout=10)
    return first, displaced, newer


@pytest.fixture
def left_behind(worker: Any, celery_app: Any, locker: RedisLocker, unique_key: str) -> Any:
    """A call displaced by an acquire whose worker died before marking it: its AsyncResult."""
    first = _running(unique_key, "v1", 0.5)
    displaced = celery_app.AsyncResult("left-" + unique_key)
    park_newest(locker, unique_key, displaced.id, "v2")
    park_newest(locker, unique_key, "newer-" + unique_key, "v3")
    yield displaced
    first.get(timeout=10)


def test_a_displaced_call_left_unmarked_is_pending_until_a_sweeper_looks(
    left_behind: Any,
) -> None:
    assert left_behind.state == "PENDING"


def test_the_sweeper_marks_a_displaced_call_left_unmarked_revoked_superseded(
    left_behind: Any, celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    sweep_after_the_grace(celery_app, locker, unique_key)
    with pytest.raises(TaskRevokedError, match="superseded"):
        left_behind.get(timeout=10)


def test_the_sweeper_clears_what_it_marked(
    left_behind: Any, celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    sweep_after_the_grace(celery_app, locker, unique_key)
    assert [n for n, _ in locker.latest.superseded_left() if unique_key in n] == []


def test_the_displacing_worker_clears_the_calls_it_marked(
    worker: Any, locker: RedisLocker, unique_key: str
) -> None:
    first, _, _ = displaced_by_the_worker(locker, unique_key, 0.5)
    name = latestapp.newest.lock_options.keyer.name((unique_key, 0), {})
    assert locker.client.hlen(superseded_keys(locker.keys(name), locker.shared.superseded)[1]) == 0
    first.get(timeout=10)


def test_a_stale_copy_of_a_displaced_call_does_not_run_or_displace_the_newer_call(
    worker: Any, locker: RedisLocker, unique_key: str
) -> None:
    first, displaced, newer = displaced_by_the_worker(locker, unique_key, 1.0)
    wait_until(lambda: displaced.id in state.revoked, timeout=10)
    state.revoked.discard(displaced.id)  # this worker missed the revoke broadcast
    stale = latestapp.newest.apply_async((unique_key, "v2"), task_id=displaced.id)
    assert first.get(timeout=10) == "v1"
    assert newer.get(timeout=10) == "v3"
    with pytest.raises(TaskRevokedError, match="superseded"):
        stale.get(timeout=10)
    assert [value for value, _ in latestapp.started(unique_key)] == ["v1", "v3"]


def test_the_sweeper_sleeps_until_a_debounced_call_falls_due_not_a_whole_interval(
    celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    """Issue 30, item 7: a debounce's end is met when it comes, not at the sweeper's next
    tick after it (an interval of 30 s here: a sweeper that slept it would run the call
    up to 30 s late)."""
    name = latestapp.newest.lock_options.keyer.name((unique_key, "v1"), {})
    call = {"task": latestapp.newest.name, "args": [unique_key, "v1"], "kwargs": {}, "options": {}}
    held_back = locker.try_acquire(
        name,
        ttl=30,
        owner=Owner(task_id="t-debounced"),
        renew=False,
        park=f"t-debounced\n{json.dumps(call)}".encode(),  # type: ignore[no-untyped-call]
        reservation_ttl=30,
        latest=Latest(debounce=2.0),
    )
    assert isinstance(held_back, Parked)  # held back 2 s, on a free lock
    _, reservation_ttl = handoff_settings(celery_app.conf)
    sweeper = HandOffSweeper(celery_app, 30.0, reservation_ttl)
    sweeper.tick()
    assert sweeper.pause() <= 2.0
