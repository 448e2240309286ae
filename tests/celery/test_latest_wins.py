"""Policy ``replace`` on the in-process worker: the newest duplicate waits alone, the calls it
displaced end REVOKED ("superseded") with their callbacks not called."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import chain, chord, group
from celery.exceptions import TaskRevokedError

from celery_singleton_lock.celery import lock_duplicate
from celery_singleton_lock.celery.duplicates.latest import SENT_HEADER
from celery_singleton_lock.engine import RedisLocker
from tests.celery import latestapp
from tests.celery.conftest import assert_released, lock_key_of
from tests.support import wait_until


def _running(key: str, value: Any, seconds: float, **options: Any) -> Any:
    """A call of ``newest`` whose body is running (for ``seconds``) once this returns."""
    result = latestapp.newest.apply_async((key, value, seconds), **options)
    wait_until(lambda: len(latestapp.started(key)) == 1, timeout=10)
    return result


def _waiting(locker: RedisLocker, key: str) -> list[bytes]:
    name = latestapp.newest.lock_options.keyer.name((key, 0), {})
    return list(locker.client.zrange(locker.keys(name).parked, 0, -1))


def test_the_newest_duplicate_runs_after_the_running_call_and_the_others_are_superseded(
    worker: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    first = _running(unique_key, "v1", 1.0)
    later = []
    for value in ("v2", "v3", "v4"):  # one by one: each waits before the next comes
        later.append(latestapp.newest.delay(unique_key, value))
        wait_until(lambda r=later[-1]: _waiting(locker, unique_key) == [r.id.encode()], 10)
    v2, v3, v4 = later
    wait_until(lambda: v2.state == v3.state == "REVOKED", timeout=10)
    assert len(latestapp.started(unique_key)) == 1  # displaced while v1 still ran
    assert first.get(timeout=10) == "v1"
    assert v4.get(timeout=10) == "v4"
    assert [value for value, _ in latestapp.started(unique_key)] == ["v1", "v4"]
    assert int(store.get(f"overlaps:{unique_key}") or 0) == 0
    assert_released(store, latestapp.newest.lock_options.keyer.name((unique_key, 0), {}))


def test_a_superseded_calls_get_raises_task_revoked_superseded(
    worker: Any, locker: RedisLocker, unique_key: str
) -> None:
    first = _running(unique_key, "v1", 0.5)
    displaced = latestapp.newest.delay(unique_key, "v2")
    wait_until(lambda: _waiting(locker, unique_key) == [displaced.id.encode()], timeout=10)
    latestapp.newest.delay(unique_key, "v3")
    with pytest.raises(TaskRevokedError, match="superseded"):
        displaced.get(timeout=10)
    first.get(timeout=10)


def test_a_call_sent_by_name_is_superseded_like_any_other(
    worker: Any, celery_app: Any, locker: RedisLocker, unique_key: str
) -> None:
    first = _running(unique_key, "v1", 0.5)
    name = latestapp.newest.name
    displaced = celery_app.send_task(name, (unique_key, "v2"))
    wait_until(lambda: _waiting(locker, unique_key) == [displaced.id.encode()], timeout=10)
    newest = celery_app.send_task(name, (unique_key, "v3"))
    first.get(timeout=10)
    assert newest.get(timeout=10) == "v3"
    assert displaced.state == "REVOKED"


def test_a_superseded_calls_link_and_link_error_are_not_called(
    worker: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    first = _running(unique_key, "v1", 0.5)
    displaced = latestapp.newest.apply_async(
        (unique_key, "v2"),
        link=latestapp.callback.si(unique_key, "v2 link"),
        link_error=latestapp.callback.si(unique_key, "v2 link_error"),
    )
    wait_until(lambda: _waiting(locker, unique_key) == [displaced.id.encode()], timeout=10)
    newest = latestapp.newest.apply_async(
        (unique_key, "v3"), link=latestapp.callback.si(unique_key, "v3 link")
    )
    first.get(timeout=10)
    newest.get(timeout=10)
    wait_until(lambda: store.llen(f"callbacks:{unique_key}") == 1, timeout=10)
    assert store.lrange(f"callbacks:{unique_key}", 0, -1) == [b"v3 link"]
    assert displaced.state == "REVOKED"


def test_a_superseded_chain_step_sends_none_of_the_steps_after_it(
    worker: Any, locker: RedisLocker, store: redis.Redis, unique_key: str
) -> None:
    first = _running(unique_key, "v1", 0.5)
    steps = chain(
        latestapp.newest.si(unique_key, "v2"), latestapp.callback.si(unique_key, "after v2")
    ).delay()
    wait_until(lambda: len(_waiting(locker, unique_key)) == 1, timeout=10)
    newest = latestapp.newest.delay(unique_key, "v3")
    first.get(timeout=10)
    assert newest.get(timeout=10) == "v3"
    assert steps.parent.state == "REVOKED"
    assert store.llen(f"callbacks:{unique_key}") == 0


def test_a_call_held_back_on_a_free_lock_is_announced_with_the_reason_debounce(
    worker: Any, locker: RedisLocker, unique_key: str
) -> None:
    seen: list[tuple[str, str]] = []

    def on_duplicate(sender: Any = None, action: str = "", reason: str = "", **_: Any) -> None:
        if getattr(sender, "name", None) == latestapp.debounced.name:
            seen.append((action, reason))

    lock_duplicate.connect(on_duplicate, weak=False)
    name = latestapp.debounced.lock_options.keyer.name((unique_key, 0), {})
    try:
        held = latestapp.debounced.delay(unique_key, "v1")
        wait_until(lambda: seen == [("replace", "debounce")], timeout=10)
    finally:
        lock_duplicate.disconnect(on_duplicate)
        # this worker runs no sweeper: take the held call out, no other worker's sweeper sends it
        locker.queue.drop_parked(name, held.id, reservation_ttl=30)
    assert latestapp.started(unique_key) == []


def test_a_chord_whose_header_call_is_superseded_fails_as_superseded_without_its_body(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    header = group(latestapp.newest.si(unique_key, f"v{i}", 1.0) for i in range(3))
    result = chord(header)(latestapp.callback.si(unique_key, "chord body"))
    with pytest.raises(TaskRevokedError, match="superseded"):
        result.get(timeout=20)
    # the first to lock, then the newest: both run, the chord body never
    wait_until(lambda: len(latestapp.started(unique_key)) == 2, timeout=20)
    wait_until(lambda: not store.exists(lock_key_of(latestapp.newest, unique_key, 0)), 10)
    assert store.llen(f"callbacks:{unique_key}") == 0


def test_a_call_sent_without_a_stamp_is_stamped_at_the_worker_and_an_older_one_never_waits(
    worker: Any, locker: RedisLocker, unique_key: str
) -> None:
    first = _running(unique_key, "v1", 1.0)
    # send_task bypasses LockedTask.apply_async (another app, beat): no stamp on the message
    unstamped = latestapp.app.send_task(latestapp.newest.name, (unique_key, "v2"))
    wait_until(lambda: _waiting(locker, unique_key) == [unstamped.id.encode()], timeout=10)
    name = latestapp.newest.lock_options.keyer.name((unique_key, 0), {})
    keys = locker.keys(name)
    stamp = locker.client.hget(keys.lock + ":latest", "sent")
    assert stamp is not None  # stamped when the worker first tried its lock
    parked = locker.client.hget(keys.parked_messages, unstamped.id) or b""
    assert stamp in parked  # its hand-off message keeps that stamp
    older = latestapp.newest.apply_async(
        (unique_key, "v0"), headers={SENT_HEADER: "0000000000000001.1"}
    )  # sent before it, reaching the lock after it
    with pytest.raises(TaskRevokedError, match="superseded"):
        older.get(timeout=10)
    assert _waiting(locker, unique_key) == [unstamped.id.encode()]
    left = keys.lock + ":superseded-left"  # the worker marked it: not left to a sweeper
    wait_until(lambda: not locker.client.hexists(left, older.id), timeout=10)
    assert first.get(timeout=10) == "v1"
    assert unstamped.get(timeout=10) == "v2"
    assert [value for value, _ in latestapp.started(unique_key)] == ["v1", "v2"]


def test_a_retry_keeps_the_stamp_of_the_call_sent_and_other_policies_are_not_stamped(
    worker: Any, store: redis.Redis, unique_key: str
) -> None:
    latestapp.retried_once.delay(unique_key)
    wait_until(lambda: store.llen(f"sent:{unique_key}") == 2, timeout=10)
    first, retried = store.lrange(f"sent:{unique_key}", 0, -1)
    assert first == retried and first.startswith(b"1")  # the retry ran: not superseded
    latestapp.skipping.delay(unique_key + "s").get(timeout=10)
    assert store.lrange(f"sent:{unique_key}s", 0, -1) == [b"None"]
