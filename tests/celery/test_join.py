"""``on_duplicate="join"`` and what each policy does inside a chord, under real workers.

A join duplicate does not run the body: it ends with the outcome of the execution holding the
lock, stored under its own id, so ``get()``, chains and chords see it as if it had run. The
scenarios share one threads ``celery worker`` (tests/celery/workers.py), each with keys of its
own: with a slot for each of a chord's 10 calls it takes them all at once, so every duplicate
meets the holder running. A scenario that kills a holder runs it on a prefork worker of its
own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from typing import Any, Iterator

import pytest
import redis
from celery import Celery, chain, chord, group
from celery.exceptions import ChordError
from celery.result import AsyncResult

from celery_singleton_lock import DuplicateTaskSkipped
from celery_singleton_lock.testing import RedisServer
from tests.celery.tasks import canvas, join, policies
from tests.celery.workers import (
    CeleryWorkerProcess,
    Servers,
    WorkerGroup,
    client_app,
    close_client,
    lock_key,
    unique,
    worker_group,
)
from tests.support import wait_until

CALLS = 10


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    with RedisServer.running() as broker, RedisServer.running() as lock:
        yield Servers(broker_url=broker.url, lock=lock)


@pytest.fixture(scope="module")
def store(servers: Servers) -> Iterator[redis.Redis]:
    connection = servers.lock.client(socket_timeout=5)
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def workers(servers: Servers) -> Iterator[WorkerGroup]:
    with worker_group(servers) as group:
        yield group


@pytest.fixture(scope="module")
def queue(workers: WorkerGroup) -> str:
    """A threads worker with a slot for each of the chord's calls."""
    (started,) = workers.start(1, pool="threads", concurrency=CALLS + 1)
    return started.queue


@pytest.fixture(scope="module")
def client(servers: Servers, queue: str) -> Iterator[Celery]:
    app = client_app(servers, queue)
    yield app
    close_client(app)


def body_runs(store: redis.Redis, key: str) -> int:
    return int(store.llen(f"runs:{key}"))


def identical_calls(client: Celery, task: Any, key: str, seconds: float) -> group:
    return group(client.signature(task.name, args=(key, seconds)) for _ in range(CALLS))


def running_holder(client: Celery, store: redis.Redis, task: Any, key: str) -> AsyncResult:
    """A call of ``task`` on ``key`` whose 2 s body has started: it holds the lock."""
    holder = client.send_task(task.name, args=(key, 2.0))
    wait_until(lambda: body_runs(store, key) == 1, timeout=15)
    return holder


def callback(client: Celery) -> Any:
    return client.signature(canvas.collects.name)


# -- a chord of identical join calls ----------------------------------------------------------


@pytest.fixture(scope="module")
def joined_chord(client: Celery, store: redis.Redis) -> tuple[str, list[Any]]:
    key = unique("join-chord")
    result = chord(identical_calls(client, join.join_value, key, 3.0))(callback(client))
    return key, result.get(timeout=60)


def test_chord_of_identical_join_calls_gets_the_holders_result_for_every_call(
    joined_chord: tuple[str, list[Any]],
) -> None:
    key, results = joined_chord
    assert len(results) == CALLS
    assert results == [results[0]] * CALLS
    assert results[0]["key"] == key


def test_chord_of_identical_join_calls_runs_the_body_once(
    joined_chord: tuple[str, list[Any]], store: redis.Redis
) -> None:
    key, _ = joined_chord
    assert body_runs(store, key) == 1


def test_group_of_identical_join_calls_stores_success_under_every_id(
    client: Celery, store: redis.Redis
) -> None:
    key = unique("join-group")
    result = identical_calls(client, join.join_value, key, 2.0).apply_async()
    values = result.get(timeout=60)
    assert values == [values[0]] * CALLS
    assert [each.state for each in result.results] == ["SUCCESS"] * CALLS
    assert body_runs(store, key) == 1


def test_join_duplicate_in_a_chain_sends_the_next_step_with_the_joined_value(
    client: Celery, store: redis.Redis
) -> None:
    key = unique("join-chain")
    holder = running_holder(client, store, join.join_value, key)
    steps = chain(
        client.signature(join.join_value.name, args=(key, 2.0)),
        client.signature(canvas.tags.name, args=("next",)),
    ).apply_async()
    assert steps.get(timeout=30) == ["next", holder.get(timeout=30)]
    assert body_runs(store, key) == 1


def test_join_duplicate_sends_its_link_callback_with_the_joined_value(
    client: Celery, store: redis.Redis
) -> None:
    key = unique("join-link")
    holder = running_holder(client, store, join.join_value, key)
    link = client.signature(canvas.tags.name, args=("linked",))
    duplicate = client.send_task(join.join_value.name, args=(key, 2.0), link=link)
    duplicate.get(timeout=30)
    (child,) = AsyncResult(duplicate.id, app=client).children or []
    assert child.get(timeout=30) == ["linked", holder.get(timeout=30)]


# -- the holder raises ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def joined_failure(client: Celery, store: redis.Redis) -> tuple[str, list[BaseException]]:
    key = unique("join-raises")
    result = identical_calls(client, join.join_raises, key, 2.0).apply_async()
    errors: list[BaseException] = []
    for each in result.results:
        with pytest.raises(Exception) as caught:
            each.get(timeout=60, propagate=True)
        errors.append(caught.value)
    return key, errors


def test_holder_raising_gives_every_joiner_the_same_exception_type(
    joined_failure: tuple[str, list[BaseException]],
) -> None:
    _, errors = joined_failure
    assert Counter(type(error).__name__ for error in errors) == {"AccountMissing": CALLS}


def test_holder_raising_gives_every_joiner_the_same_message(
    joined_failure: tuple[str, list[BaseException]],
) -> None:
    key, errors = joined_failure
    assert {str(error) for error in errors} == {f"no account {key}"}


def test_holder_raising_runs_the_body_once(
    joined_failure: tuple[str, list[BaseException]], store: redis.Redis
) -> None:
    key, _ = joined_failure
    assert body_runs(store, key) == 1


def test_join_duplicate_of_a_failing_holder_calls_its_errback_once(
    client: Celery, store: redis.Redis
) -> None:
    key = unique("join-errback")
    holder = running_holder(client, store, join.join_raises, key)
    errback = client.signature(canvas.records_errback.name, kwargs={"key": key})
    duplicate = client.send_task(join.join_raises.name, args=(key, 2.0), link_error=errback)
    with pytest.raises(Exception, match=f"no account {key}"):
        duplicate.get(timeout=30)
    with pytest.raises(Exception, match=f"no account {key}"):
        holder.get(timeout=30)
    wait_until(lambda: store.llen(f"errbacks:{key}") >= 1, timeout=15)
    assert [raw.decode() for raw in store.lrange(f"errbacks:{key}", 0, -1)] == [duplicate.id]


# -- skip and retry inside a chord ------------------------------------------------------------


@pytest.fixture(scope="module")
def skipped_chord(client: Celery) -> tuple[str, AsyncResult, BaseException]:
    key = unique("skip-chord")
    result = chord(identical_calls(client, policies.hold_skip, key, 2.0))(callback(client))
    with pytest.raises(DuplicateTaskSkipped) as caught:  # get() raises a member's error first
        result.get(timeout=60)
    wait_until(lambda: result.state == "FAILURE", timeout=15)
    return key, result, caught.value


def test_chord_of_identical_skip_calls_fails_its_callback_with_chord_error(
    skipped_chord: tuple[str, AsyncResult, BaseException],
) -> None:
    _, result, _ = skipped_chord
    assert isinstance(result.result, ChordError)
    assert "DuplicateTaskSkipped" in str(result.result)


def test_chord_of_identical_skip_calls_stores_each_skip_as_revoked(
    skipped_chord: tuple[str, AsyncResult, BaseException], store: redis.Redis
) -> None:
    key, result, _ = skipped_chord
    members = result.parent.results
    assert Counter(each.state for each in members) == {"SUCCESS": 1, "REVOKED": CALLS - 1}
    assert body_runs(store, key) == 1


def test_chord_of_identical_retry_calls_completes_with_every_body_run(
    client: Celery, store: redis.Redis
) -> None:
    key = unique("retry-chord")
    result = chord(identical_calls(client, policies.hold_retry, key, 0.3))(callback(client))
    assert len(result.get(timeout=90)) == CALLS
    assert body_runs(store, key) == CALLS


def test_skip_tasks_own_retry_finding_a_newer_duplicate_holding_the_lock_ends_skipped(
    client: Celery, store: redis.Redis
) -> None:
    key = unique("skip-own-retry")
    task = join.retries_in_two_seconds.name
    retrying = client.send_task(task, args=(key, True))
    wait_until(lambda: retrying.state == "RETRY", timeout=15)  # the lock is released
    newer = client.send_task(task, args=(key, False))
    wait_until(lambda: body_runs(store, key) == 1, timeout=15)
    with pytest.raises(DuplicateTaskSkipped, match=newer.id):
        retrying.get(timeout=30)
    assert newer.get(timeout=30)["key"] == key
    assert body_runs(store, key) == 1


# -- the holder is killed -9 ------------------------------------------------------------------


@contextlib.contextmanager
def holder_and_joiners(
    workers: WorkerGroup, servers: Servers, store: redis.Redis, key: str, joiners: int, queue: str
) -> Iterator[tuple[CeleryWorkerProcess, AsyncResult, list[AsyncResult]]]:
    """join_short_ttl (lock_ttl=2) running 30 s on a prefork worker of its own (its body has
    started), and ``joiners`` duplicates sent to the module's threads worker (``queue``: a
    slot for each, and it lives through the kill)."""
    (holder_worker,) = workers.start(1, pool="prefork", concurrency=1)
    sender = client_app(servers)
    try:
        holder = sender.send_task(
            join.join_short_ttl.name, args=(key, 30.0), queue=holder_worker.queue
        )
        wait_until(lambda: body_runs(store, key) == 1, timeout=15)
        yield (
            holder_worker,
            holder,
            [
                sender.send_task(join.join_short_ttl.name, args=(key, 1.0), queue=queue)
                for _ in range(joiners)
            ],
        )
    finally:
        close_client(sender)


@pytest.fixture(scope="module")
def holder_killed(
    workers: WorkerGroup, servers: Servers, store: redis.Redis, queue: str
) -> tuple[str, list[Any], list[str]]:
    """join_short_ttl (lock_ttl=2) runs 30 s on a prefork worker that is then killed -9 with
    three joiners waiting on a threads worker: its lock expires with no outcome stored."""
    key = unique("join-kill")
    with holder_and_joiners(workers, servers, store, key, 3, queue) as scene:
        holder_worker, holder, joiners = scene
        name = lock_key(join.join_short_ttl, key)
        wait_until(lambda: store.exists(name) == 1, timeout=5)
        holder_worker.kill_group(signal.SIGKILL)
        killed_at = time.time()
        values = [joiner.get(timeout=60) for joiner in joiners]
        ran = [raw.decode().split("|") for raw in store.lrange(f"runs:{key}", 0, -1)]
        assert holder.id == ran[0][0]
        after = ", ".join(f"{float(started) - killed_at:.2f}s" for _, _, started in ran[1:])
        print(f"kill -9 of the holder (lock_ttl=2): bodies started {after} after the kill")
        return key, values, [task_id for task_id, _, _ in ran[1:]]


def test_holder_killed_one_joiner_runs_the_body(
    holder_killed: tuple[str, list[Any], list[str]],
) -> None:
    _, _, ran_after_the_kill = holder_killed
    assert len(ran_after_the_kill) == 1


def test_holder_killed_the_other_joiners_get_the_result_of_the_one_that_ran(
    holder_killed: tuple[str, list[Any], list[str]],
) -> None:
    key, values, _ = holder_killed
    assert values == [values[0]] * 3
    assert values[0]["key"] == key


# -- the holder's pool child is killed -9 (its worker lives on) --------------------------------

JOINERS = 10


@pytest.fixture(scope="module")
def holder_child_killed(
    workers: WorkerGroup, servers: Servers, store: redis.Redis, queue: str
) -> tuple[str, AsyncResult, list[AsyncResult], list[str]]:
    """join_short_ttl runs 30 s in a prefork pool child that is then killed -9, with ten
    joiners waiting on a threads worker: the holder's worker lives on, frees the lock at once
    and stores WorkerLostError as the holder's outcome."""
    key = unique("join-child-kill")
    with holder_and_joiners(workers, servers, store, key, JOINERS, queue) as scene:
        _, holder, joiners = scene
        channel = lock_key(join.join_short_ttl, key) + ":released"
        # every joiner waits on the lock's release channel before the holder dies
        wait_until(lambda: store.pubsub_numsub(channel)[0][1] >= JOINERS, timeout=20)
        holder_pid = int(store.lindex(f"runs:{key}", 0).split(b"|")[1])
        os.kill(holder_pid, signal.SIGKILL)
        for joiner in joiners:
            joiner.get(timeout=60, propagate=False)
        holder.get(timeout=30, propagate=False)
        ran = [raw.decode().split("|")[0] for raw in store.lrange(f"runs:{key}", 1, -1)]
        return key, holder, joiners, ran


def test_holder_child_killed_one_joiner_runs_the_body(
    holder_child_killed: tuple[str, AsyncResult, list[AsyncResult], list[str]],
) -> None:
    _, _, joiners, ran = holder_child_killed
    assert len(ran) == 1
    assert ran[0] in {joiner.id for joiner in joiners}


def test_holder_child_killed_every_joiner_gets_the_result_of_the_one_that_ran(
    holder_child_killed: tuple[str, AsyncResult, list[AsyncResult], list[str]],
) -> None:
    key, _, joiners, _ = holder_child_killed
    assert [joiner.state for joiner in joiners] == ["SUCCESS"] * JOINERS
    values = [joiner.result for joiner in joiners]
    assert values == [values[0]] * JOINERS
    assert values[0]["key"] == key


def test_holder_child_killed_only_the_holders_caller_gets_worker_lost_error(
    holder_child_killed: tuple[str, AsyncResult, list[AsyncResult], list[str]],
) -> None:
    _, holder, _, _ = holder_child_killed
    assert holder.state == "FAILURE"
    assert type(holder.result).__name__ == "WorkerLostError"
