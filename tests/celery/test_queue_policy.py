"""Policy ``queue`` on a real worker: duplicates parked in Redis, run one at a time in order."""

from __future__ import annotations

import json
import logging
from typing import Any, Callable

import pytest
import redis
from celery import chain, chord, group, signals
from celery.app.task import Context
from celery.utils import uuid

from celery_singleton_lock.celery.duplicates import parking as handoff
from celery_singleton_lock.engine import Lease, Owner, RedisLocker
from celery_singleton_lock.engine.lease import Parked
from tests.celery.conftest import assert_released, lock_key_of
from tests.celery.tasks import canvas, queueing
from tests.support import wait_until


def _hold(locker: RedisLocker, task: Any, key: str, ttl: float = 30) -> Lease:
    options = task.lock_options  # where the task's own calls look (its slot table or key)
    name, owner = options.keyer.name((key,), {}), Owner(task_id="holder")
    lease = locker.try_acquire(name, ttl, owner=owner, renew=False, slotted=options.slotted)
    assert isinstance(lease, Lease)
    return lease


def test_every_duplicate_runs_once_in_arrival_order(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    task = queueing.gated_in_order
    parked = lock_key_of(task, unique_key, 0) + ":parked"
    results = []
    for index in range(6):  # one by one, each once the one before reached the lock
        results.append(task.delay(unique_key, index))
        if index == 0:  # it holds the lock at its gate until every other call is parked
            wait_until(lambda: store.llen(f"order:{unique_key}") == 1, timeout=20)
        else:
            wait_until(lambda index=index: store.zcard(parked) == index, timeout=20)
    store.rpush(f"gate:{unique_key}", *["open"] * 6)
    assert [result.get(timeout=30) for result in results] == list(range(6))
    assert store.lrange(f"order:{unique_key}", 0, -1) == [str(i).encode() for i in range(6)]
    assert int(store.get(f"overlaps:{unique_key}") or 0) == 0
    assert_released(store, lock_key_of(task, unique_key, 0))


def test_a_parked_duplicate_holds_no_worker_slot(
    worker: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    lease = _hold(locker, queueing.hold_queue, unique_key)
    parked = [queueing.hold_queue.delay(unique_key) for _ in range(6)]  # more than the 4 slots
    other = queueing.hold_queue.delay(f"{unique_key}-other")
    other.get(timeout=10)  # a slot was free: the six parked ones hold none
    keys = locker.keys(queueing.hold_queue.lock_options.keyer.name((unique_key,), {}))
    wait_until(lambda: store.zcard(keys.parked) == 6, timeout=10)
    assert all(result.state == "PENDING" for result in parked)
    assert store.llen(f"runs:{unique_key}") == 0
    lease.release()  # released from outside, without a hand-off: the sweeper is not running
    assert_released(store, lease.key)


def test_the_holders_release_starts_the_oldest_parked_duplicate(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    first = queueing.hold_queue.delay(unique_key, 0.5)
    wait_until(lambda: store.llen(f"runs:{unique_key}") == 1, timeout=10)
    second = queueing.hold_queue.delay(unique_key, 0.0)
    first.get(timeout=10)
    second.get(timeout=10)
    runs = store.lrange(f"runs:{unique_key}", 0, -1)
    assert [run.split(b"|")[0].decode() for run in runs] == [first.id, second.id]
    first_started = float(runs[0].split(b"|")[2])
    second_started = float(runs[1].split(b"|")[2])
    assert second_started - first_started >= 0.5  # never alongside


def test_a_chord_of_identical_queued_calls_completes_with_every_result(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    header = group(queueing.queued_in_order.s(unique_key, index, 0.05) for index in range(5))
    result = chord(header)(canvas.collects.s())
    assert sorted(result.get(timeout=30)) == list(range(5))
    assert int(store.get(f"overlaps:{unique_key}") or 0) == 0


def test_a_parked_call_whose_message_cannot_be_read_is_dropped_and_the_next_one_runs(
    worker: Any,
    locker: RedisLocker,
    store: redis.Redis,
    unique_key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = queueing.queued_in_order
    name = task.lock_options.keyer.name((unique_key, 0), {})
    holder = task.delay(unique_key, 0, 1.0)
    wait_until(lambda: store.llen(f"order:{unique_key}") == 1, timeout=10)
    # a damaged message (or one parked by an older release in another format)
    unreadable = f"unreadable-{unique_key}"
    message = f"{unreadable}\n".encode() + b"\x80\x04 not JSON"
    parked = locker.try_acquire(
        name, 30, owner=Owner(task_id=unreadable), renew=False, park=message
    )
    assert isinstance(parked, Parked) and parked.position == 1
    with caplog.at_level(logging.ERROR, logger="celery_singleton_lock.handoff"):
        following = task.delay(unique_key, 2, 0.0)
        assert holder.get(timeout=10) == 0
        assert following.get(timeout=20) == 2
    assert store.lrange(f"order:{unique_key}", 0, -1) == [b"0", b"2"]
    assert store.zcard(locker.keys(name).parked) == 0
    assert any(unreadable in record.getMessage() for record in caplog.records)


def _ended(task_id: str) -> Callable[[], int]:
    """How many deliveries of ``task_id`` the worker has ended (run, parked or dropped)."""
    ended: list[str] = []

    def on_postrun(task_id: str = "", **_: Any) -> None:
        ended.append(task_id)

    signals.task_postrun.connect(on_postrun, weak=False)
    return lambda: ended.count(task_id)


def test_a_parked_message_sent_again_keeps_its_place_and_runs_once(
    worker: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    # an acks_late message redelivered while parked, then again after it ran
    task = queueing.queued_acks_late
    keys = locker.keys(task.lock_options.keyer.name((unique_key, 0), {}))
    holder = task.delay(unique_key, 0, 1.0)
    wait_until(lambda: store.llen(f"order:{unique_key}") == 1, timeout=10)
    copy_id = uuid()
    ended = _ended(copy_id)
    first = task.apply_async((unique_key, 1), task_id=copy_id)
    task.apply_async((unique_key, 1), task_id=copy_id)
    wait_until(lambda: ended() == 2, timeout=10)
    assert store.zrange(keys.parked, 0, -1) == [copy_id.encode()]
    assert holder.get(timeout=10) == 0
    assert first.get(timeout=20) == 1
    task.apply_async((unique_key, 1), task_id=copy_id)  # after it ran: its finish drops it
    wait_until(lambda: ended() == 4, timeout=10)
    assert store.lrange(f"order:{unique_key}", 0, -1) == [b"0", b"1"]
    assert store.zcard(keys.parked) == 0
    assert_released(store, keys.lock)


def test_a_queued_task_retrying_itself_hands_on_and_its_retry_runs_later(
    worker: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    task = queueing.queued_retries_once
    keys = locker.keys(task.lock_options.keyer.name((unique_key, 0), {}))
    first = task.delay(unique_key, 0, 0.3)
    wait_until(lambda: store.llen(f"order:{unique_key}") == 1, timeout=10)
    others = []
    for index in (1, 2):  # one by one: their arrival order is their index order
        others.append(task.delay(unique_key, index, 0.1))
        wait_until(lambda index=index: store.zcard(keys.parked) == index, timeout=10)
    assert [r.get(timeout=20) for r in [first, *others]] == [0, 1, 2]
    runs = [int(index) for index in store.lrange(f"order:{unique_key}", 0, -1)]
    assert runs[:2] == [0, 1]  # the retry handed the lock to the oldest parked call
    assert sorted(runs) == [0, 0, 1, 1, 2, 2]  # each attempt ran once: 3 first, 3 retries
    assert int(store.get(f"overlaps:{unique_key}") or 0) == 0
    assert store.zcard(keys.parked) == 0
    assert_released(store, keys.lock)


def test_a_chain_goes_on_after_its_parked_step_runs(
    worker: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    task = queueing.queued_in_order
    keys = locker.keys(task.lock_options.keyer.name((unique_key, 0), {}))
    holder = task.delay(unique_key, 0, 0.5)
    wait_until(lambda: store.llen(f"order:{unique_key}") == 1, timeout=10)
    steps = chain(task.si(unique_key, 1, 0.05), task.si(unique_key, 2, 0.05)).delay()
    wait_until(lambda: store.zcard(keys.parked) == 1, timeout=10)  # its first step is parked
    assert holder.get(timeout=10) == 0
    assert steps.get(timeout=20) == 2
    assert store.lrange(f"order:{unique_key}", 0, -1) == [b"0", b"1", b"2"]


def test_a_call_whose_arguments_json_cannot_hold_is_not_parked(
    celery_app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    request = Context(id="t-1", args=["k", 1, object()], kwargs={}, delivery_info={})
    with caplog.at_level(logging.WARNING, logger="celery_singleton_lock.handoff"):
        assert handoff.parked_message(queueing.queued_in_order, request) is None
    assert "queued_in_order[t-1]: cannot park this call" in caplog.text


def test_a_parked_message_is_its_task_id_then_json(celery_app: Any) -> None:
    request = Context(id="t-2", args=["k", 1, 0.5], kwargs={}, delivery_info={})
    message = handoff.parked_message(queueing.queued_in_order, request)
    assert message is not None
    task_id, body = message.split(b"\n", 1)
    assert task_id == b"t-2"
    assert json.loads(body)["args"] == ["k", 1, 0.5]


def test_a_call_json_cannot_hold_keeps_its_serializer_on_its_lock_retry(
    worker: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    task = queueing.queued_colour
    name = task.lock_options.keyer.name((unique_key, queueing.Colour.RED), {})
    holder = Owner(task_id="holder")
    lease = locker.try_acquire(name, 30, owner=holder, renew=False, slotted=True)  # as queue's
    assert isinstance(lease, Lease)
    result = task.apply_async((unique_key, queueing.Colour.RED), serializer="pickle")
    wait_until(lambda: result.state == "RETRY", timeout=10)  # not parked: a lock retry
    lease.release()
    assert result.get(timeout=30) == "RED"
    assert store.lrange(f"order:{unique_key}", 0, -1) == [b"RED"]
