"""Enqueue deduplication with real ``celery worker`` processes (prefork): what the main
process does (revoked messages) and a message redelivered after its worker was killed.

The test process sends through ``lockapp.app`` itself (only a task object deduplicates at
enqueue), so the workers share the session's broker and lock servers, each on a queue of its
own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import pytest

from celery_singleton_lock.engine import RedisLocker
from tests.celery import lockapp
from tests.celery.tasks import core, dedupe
from tests.celery.test_enqueue_dedupe import name_of, published, runs
from tests.celery.workers import CeleryWorkerProcess, Servers, unique, worker_group
from tests.support import wait_until


@pytest.fixture(scope="module")
def servers(servers: Servers) -> Servers:
    # a short visibility timeout: a killed worker's reserved message comes back within 2 s
    return dataclasses.replace(servers, visibility_timeout=2)


@pytest.fixture(scope="module")
def prefork(servers: Servers, celery_app: Any) -> Iterator[CeleryWorkerProcess]:
    with worker_group(servers) as group:
        (worker,) = group.start(1, pool="prefork", concurrency=2)
        yield worker


def test_a_thousand_duplicate_sends_publish_one_message_and_run_once_on_prefork(
    prefork: CeleryWorkerProcess,
) -> None:
    key = unique("k")
    with published(dedupe.dedupe_gated) as ids:
        results = [
            dedupe.dedupe_gated.apply_async((key,), queue=prefork.queue) for _ in range(1000)
        ]
    core.open_gate(key)
    assert len(ids) == 1
    assert {result.id for result in results} == {ids[0]}
    assert results[0].get(timeout=30) == ids[0]
    assert runs(key) == [ids[0]]


def test_the_prefork_main_process_clears_the_marker_of_a_revoked_message(
    prefork: CeleryWorkerProcess, locker: RedisLocker
) -> None:
    key = unique("k")
    name = name_of(dedupe.dedupe_gated, key)
    result = dedupe.dedupe_gated.apply_async((key,), queue=prefork.queue, countdown=1)
    assert locker.markers.queued(name) == result.id
    lockapp.app.control.revoke(result.id, destination=[prefork.name])
    wait_until(lambda: locker.markers.queued(name) is None, timeout=15)
    wait_until(lambda: result.state == "REVOKED", timeout=10)
    assert runs(key) == []


def test_a_redelivered_message_takes_its_own_marker_and_runs_once(
    servers: Servers, locker: RedisLocker, celery_app: Any
) -> None:
    busy, key = unique("busy"), unique("k")
    name = name_of(dedupe.dedupe_gated, key)
    with worker_group(servers) as group:
        (first,) = group.start(1, pool="prefork", concurrency=1)
        queue = first.queue
        dedupe.dedupe_gated.apply_async((busy,), queue=queue)  # occupies the only child
        wait_until(lambda: runs(busy), timeout=15)
        queued = dedupe.dedupe_gated.apply_async((key,), queue=queue)  # reserved behind it
        wait_until(lambda: f"Task {dedupe.dedupe_gated.name}[{queued.id}] received" in first.log())
        first.crash()
        assert runs(key) == []
        # the message is lost for now: its marker still stands for it
        assert locker.markers.queued(name) == queued.id
        assert dedupe.dedupe_gated.apply_async((key,), queue=queue).id == queued.id
        core.open_gate(key)
        group.start(1, queue=queue, pool="prefork", concurrency=1)  # restores it
        assert queued.get(timeout=30) == queued.id
    assert runs(key) == [queued.id]
    assert locker.markers.queued(name) is None
